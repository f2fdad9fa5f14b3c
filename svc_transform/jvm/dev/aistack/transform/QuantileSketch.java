package dev.aistack.transform;

import java.io.Externalizable;
import java.io.IOException;
import java.io.ObjectInput;
import java.io.ObjectOutput;
import java.nio.ByteBuffer;
import java.util.Arrays;
import org.apache.spark.sql.catalyst.expressions.aggregate.ApproximatePercentile;
import org.apache.spark.sql.catalyst.expressions.aggregate.ApproximatePercentile.PercentileDigest;

/**
 * A mergeable quantile sketch, kept as bytes between panes so that a sliding window's
 * percentiles merge its panes' sketches instead of reading every value again.
 *
 * <p>While a series has at most {@link #EXACT_DISTINCT_LIMIT} distinct values the sketch is
 * exact: each distinct value with its count. Past that it is Spark's own percentile_approx
 * digest (Greenwald-Khanna summaries, the same accuracy). The exact form answers what the
 * digest answers for values it holds exactly (the value at rank ceil(fraction * count)), and
 * stays small where the digest does not: at relative error 1/10000 a digest compresses nothing
 * below about 5,000 values and keeps every repeat, so a minute's pane of a sensor that reports
 * whole degrees held thousands of samples, rewritten into the state store on every micro-batch.
 *
 * <p>Bytes in the digest form are the digest serializer's, as before the exact form existed, so
 * a checkpoint's state written then still reads.
 */
public final class QuantileSketch implements Externalizable {
  private static final long serialVersionUID = 1L;
  /** percentile_approx's default accuracy (10000): relative error 1/10000. */
  static final double RELATIVE_ERROR = 1.0 / 10000;
  /** Distinct values kept exactly; at 16 bytes each, below the digest's size for as many. */
  static final int EXACT_DISTINCT_LIMIT = 2048;
  /**
   * The exact form's first int. The digest serializer starts with its compress threshold, which
   * is positive.
   */
  private static final int EXACT_TAG = -1;
  /** Values added since the last fold, before they are sorted into the distinct values. */
  private static final int PENDING_LIMIT = 1024;

  // Exact form (digest == null): ascending distinct values and their counts.
  private double[] values = new double[0];
  private long[] counts = new long[0];
  private int distinct;
  private double[] pending = new double[0];
  private int pendingSize;
  // Digest form.
  private PercentileDigest digest;
  private long count;

  public QuantileSketch() {}

  static QuantileSketch fromBytes(byte[] bytes) {
    QuantileSketch sketch = new QuantileSketch();
    sketch.read(bytes);
    return sketch;
  }

  void add(double value) {
    count++;
    if (digest != null) {
      digest.add(value);
      return;
    }
    if (pendingSize == PENDING_LIMIT) {
      fold();
      if (digest != null) {
        digest.add(value);
        return;
      }
    }
    if (pendingSize == pending.length) {
      pending = Arrays.copyOf(pending, Math.min(PENDING_LIMIT, Math.max(16, 2 * pendingSize)));
    }
    pending[pendingSize++] = value;
  }

  void merge(QuantileSketch other) {
    if (other.count == 0) {
      return;
    }
    other.fold();
    fold();
    if (digest == null && other.digest == null) {
      mergeExact(other.values, other.counts, other.distinct);
    } else {
      if (digest == null) {
        toDigest();
      }
      if (other.digest == null) {
        addAll(digest, other.values, other.counts, other.distinct);
      } else {
        digest.merge(other.digest);
      }
    }
    count += other.count;
  }

  /** The value at {@code fraction} (0..1), or null for an empty sketch. */
  Double percentile(double fraction) {
    if (count == 0) {
      return null;
    }
    fold();
    if (digest != null) {
      return (Double) digest.getPercentiles(new double[] {fraction}).head();
    }
    // What the digest answers for exactly held values (QuantileSummaries.query).
    if (fraction <= RELATIVE_ERROR) {
      return values[0];
    }
    if (fraction >= 1 - RELATIVE_ERROR) {
      return values[distinct - 1];
    }
    long rank = (long) Math.ceil(fraction * count);
    long below = 0;
    for (int i = 0; i < distinct - 1; i++) {
      below += counts[i];
      if (below >= rank) {
        return values[i];
      }
    }
    return values[distinct - 1];
  }

  byte[] toBytes() {
    fold();
    if (digest != null) {
      return ApproximatePercentile.serializer().serialize(digest);
    }
    ByteBuffer buffer = ByteBuffer.allocate(8 + 16 * distinct);
    buffer.putInt(EXACT_TAG).putInt(distinct);
    for (int i = 0; i < distinct; i++) {
      buffer.putDouble(values[i]).putLong(counts[i]);
    }
    return buffer.array();
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
    read(bytes);
  }

  private void read(byte[] bytes) {
    ByteBuffer buffer = ByteBuffer.wrap(bytes);
    if (buffer.getInt() != EXACT_TAG) {
      digest = ApproximatePercentile.serializer().deserialize(bytes);
      count = digest.quantileSummaries().count();
      return;
    }
    distinct = buffer.getInt();
    values = new double[distinct];
    counts = new long[distinct];
    count = 0;
    for (int i = 0; i < distinct; i++) {
      values[i] = buffer.getDouble();
      counts[i] = buffer.getLong();
      count += counts[i];
    }
  }

  /** The pending values sorted into the distinct ones (or the digest, past the limit). */
  private void fold() {
    if (pendingSize == 0) {
      return;
    }
    Arrays.sort(pending, 0, pendingSize);
    double[] runValues = new double[pendingSize];
    long[] runCounts = new long[pendingSize];
    int runs = 0;
    for (int i = 0; i < pendingSize; i++) {
      if (runs > 0 && Double.compare(runValues[runs - 1], pending[i]) == 0) {
        runCounts[runs - 1]++;
      } else {
        runValues[runs] = pending[i];
        runCounts[runs++] = 1;
      }
    }
    pendingSize = 0;
    mergeExact(runValues, runCounts, runs);
  }

  /** Ascending distinct values with counts merged into the exact form. */
  private void mergeExact(double[] otherValues, long[] otherCounts, int otherDistinct) {
    double[] mergedValues = new double[distinct + otherDistinct];
    long[] mergedCounts = new long[distinct + otherDistinct];
    int i = 0;
    int j = 0;
    int k = 0;
    while (i < distinct || j < otherDistinct) {
      int order =
          i == distinct ? 1 : j == otherDistinct ? -1 : Double.compare(values[i], otherValues[j]);
      if (order <= 0) {
        mergedValues[k] = values[i];
        mergedCounts[k] = counts[i++];
        if (order == 0) {
          mergedCounts[k] += otherCounts[j++];
        }
      } else {
        mergedValues[k] = otherValues[j];
        mergedCounts[k] = otherCounts[j++];
      }
      k++;
    }
    values = mergedValues;
    counts = mergedCounts;
    distinct = k;
    if (distinct > EXACT_DISTINCT_LIMIT) {
      toDigest();
    }
  }

  private void toDigest() {
    digest = new PercentileDigest(RELATIVE_ERROR);
    addAll(digest, values, counts, distinct);
    values = new double[0];
    counts = new long[0];
    distinct = 0;
    pending = new double[0];
  }

  private static void addAll(
      PercentileDigest digest, double[] values, long[] counts, int distinct) {
    for (int i = 0; i < distinct; i++) {
      for (long c = 0; c < counts[i]; c++) {
        digest.add(values[i]);
      }
    }
  }
}
