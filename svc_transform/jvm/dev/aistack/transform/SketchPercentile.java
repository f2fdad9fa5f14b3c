package dev.aistack.transform;

import org.apache.spark.sql.api.java.UDF2;

/** (sketch bytes, fraction) to the approximate percentile; null for no sketch or no values. */
public final class SketchPercentile implements UDF2<byte[], Double, Double> {
  private static final long serialVersionUID = 1L;

  @Override
  public Double call(byte[] sketch, Double fraction) {
    if (sketch == null || fraction == null) {
      return null;
    }
    return QuantileSketch.fromBytes(sketch).percentile(fraction);
  }
}
