package dev.aistack.transform;

import java.io.Externalizable;
import java.io.IOException;
import java.io.ObjectInput;
import java.io.ObjectOutput;
import org.apache.spark.sql.catalyst.expressions.aggregate.ApproximatePercentile;
import org.apache.spark.sql.catalyst.expressions.aggregate.ApproximatePercentile.PercentileDigest;

/**
 * A mergeable quantile sketch: Spark's own percentile_approx digest (Greenwald-Khanna
 * summaries, the same accuracy), kept as bytes between panes so that a sliding window's
 * percentiles merge its panes' sketches instead of reading every value again.
 */
public final class QuantileSketch implements Externalizable {
  private static final long serialVersionUID = 1L;
  /** percentile_approx's default accuracy (10000): relative error 1/10000. */
  static final double RELATIVE_ERROR = 1.0 / 10000;

  private PercentileDigest digest;
  private long count;

  public QuantileSketch() {
    digest = new PercentileDigest(RELATIVE_ERROR);
  }

  static QuantileSketch fromBytes(byte[] bytes) {
    QuantileSketch sketch = new QuantileSketch();
    sketch.digest = ApproximatePercentile.serializer().deserialize(bytes);
    sketch.count = sketch.digest.quantileSummaries().count();
    return sketch;
  }

  void add(double value) {
    digest.add(value);
    count++;
  }

  void merge(QuantileSketch other) {
    if (other.count > 0) {
      digest.merge(other.digest);
      count += other.count;
    }
  }

  /** The approximate value at {@code fraction} (0..1), or null for an empty sketch. */
  Double percentile(double fraction) {
    if (count == 0) {
      return null;
    }
    return (Double) digest.getPercentiles(new double[] {fraction}).head();
  }

  byte[] toBytes() {
    return ApproximatePercentile.serializer().serialize(digest);
  }

  @Override
  public void writeExternal(ObjectOutput out) throws IOException {
    byte[] bytes = toBytes();
    out.writeInt(bytes.length);
    out.write(bytes);
  }

  @Override
  public void readExternal(ObjectInput in) throws IOException {
    byte[] bytes = new byte[in.readInt()];
    in.readFully(bytes);
    digest = ApproximatePercentile.serializer().deserialize(bytes);
    count = digest.quantileSummaries().count();
  }
}
