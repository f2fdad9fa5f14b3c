package dev.aistack.transform;

/** Aggregate: sketches (bytes, nulls skipped) to the sketch of all their values. */
public final class MergeSketches extends SketchAggregator<byte[]> {
  private static final long serialVersionUID = 1L;

  @Override
  public QuantileSketch reduce(QuantileSketch sketch, byte[] bytes) {
    if (bytes != null) {
      sketch.merge(QuantileSketch.fromBytes(bytes));
    }
    return sketch;
  }
}
