package dev.aistack.transform;

/** Aggregate: values (nulls skipped) to a {@link QuantileSketch} as bytes. */
public final class SketchValues extends SketchAggregator<Double> {
  private static final long serialVersionUID = 1L;

  @Override
  public QuantileSketch reduce(QuantileSketch sketch, Double value) {
    if (value != null) {
      sketch.add(value);
    }
    return sketch;
  }
}
