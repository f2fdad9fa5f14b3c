package dev.aistack.transform;

import org.apache.spark.sql.Encoder;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.expressions.Aggregator;

/** An aggregate whose buffer is a {@link QuantileSketch} and whose result is its bytes. */
abstract class SketchAggregator<IN> extends Aggregator<IN, QuantileSketch, byte[]> {
  private static final long serialVersionUID = 1L;

  @Override
  public final QuantileSketch zero() {
    return new QuantileSketch();
  }

  @Override
  public final QuantileSketch merge(QuantileSketch left, QuantileSketch right) {
    left.merge(right);
    return left;
  }

  @Override
  public final byte[] finish(QuantileSketch sketch) {
    return sketch.toBytes();
  }

  @Override
  public final Encoder<QuantileSketch> bufferEncoder() {
    return Encoders.javaSerialization(QuantileSketch.class);
  }

  @Override
  public final Encoder<byte[]> outputEncoder() {
    return Encoders.BINARY();
  }
}
