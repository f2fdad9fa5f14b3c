package dev.aistack.transform;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.spark.api.java.function.FlatMapGroupsWithStateFunction;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.GroupState;
import org.apache.spark.sql.streaming.GroupStateTimeout;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * Every window of one stream, closed and open, from one stateful operator: each task's pane
 * summaries ({@link PaneSummaries#summariseOrReject}) grouped by series (entity, metric, path,
 * unit), each series' panes kept in its state until the watermark has closed every window that
 * holds them. A micro-batch gives the open windows (of the specs marked open) that its summaries
 * changed, as they stand, and the windows the watermark closed since the series was last seen
 * (an event-time timeout at the next window's end calls a series that has no new summaries), each
 * a row of {@link #output} tagged by {@code kind}; a record that is not a usable CleanEvent passes
 * through as a {@code rejected} row. One read of the clean topic, one state store and one
 * micro-batch's fixed cost, where the closed windows, the open ones and the dead letters were a
 * query each.
 *
 * <p>A window's statistics are those of Spark's aggregation of the same summaries ({@code
 * svc_transform.windows._merged}): sums of counts, of {@code n * mean} and of {@code m2 + n *
 * mean^2}, min and max in Spark's ordering of doubles (NaN above all), the last value by event
 * time, the merged sketch, errors and offset ranges. A window closes when the watermark reaches its
 * end, as Spark's append mode closes one; a summary older than the watermark is dropped before it
 * gets here, as Spark drops late rows.
 */
public final class WindowState
    implements FlatMapGroupsWithStateFunction<Row, Row, byte[], Row> {
  private static final long serialVersionUID = 1L;

  public static final String CLOSED = "closed";
  public static final String OPEN = "open";
  public static final String REJECTED = "rejected";

  private static final StructType KEY =
      new StructType()
          .add("entity_id", DataTypes.StringType)
          .add("metric", DataTypes.StringType)
          .add("path", DataTypes.StringType)
          .add("unit", DataTypes.StringType)
          .add("rejected", DataTypes.BooleanType, false);

  private static final StructType SUMMARY = PaneSummaries.SUMMARY;
  private static final int WINDOW = SUMMARY.fieldIndex("window");
  private static final int N = SUMMARY.fieldIndex("n");
  private static final int MEAN = SUMMARY.fieldIndex("mean");
  private static final int M2 = SUMMARY.fieldIndex("m2");
  private static final int MIN = SUMMARY.fieldIndex("min");
  private static final int MAX = SUMMARY.fieldIndex("max");
  private static final int LAST = SUMMARY.fieldIndex("last");
  private static final int LAST_TIME = SUMMARY.fieldIndex("last_event_time");
  private static final int SKETCH = SUMMARY.fieldIndex("sketch");
  private static final int ERRORS = SUMMARY.fieldIndex("errors");
  private static final int ERROR_N = SUMMARY.fieldIndex("error_n");
  private static final int SOURCES = SUMMARY.fieldIndex("sources");
  private static final int REJECTED_AT = SUMMARY.size();

  /** An output row: which kind, then what {@code windows.finish} reads. */
  static StructType output(StructType rejected) {
    StructType output =
        new StructType()
            .add("kind", DataTypes.StringType, false)
            .add(SUMMARY.apply("window"))
            .add("size", DataTypes.LongType)
            .add("slide", DataTypes.LongType)
            .add("name", DataTypes.StringType);
    for (String column : WINDOW_COLUMNS) {
      output = output.add(SUMMARY.apply(column));
    }
    return output.add(REJECTED, rejected, true);
  }

  /** The summary's columns a window has too, in {@link #windowRow}'s order. */
  private static final String[] WINDOW_COLUMNS = {
    "entity_id", "metric", "path", "unit", "n", "mean", "m2", "min", "max", "last",
    "last_event_time", "sketch", "errors", "error_n", "sources"
  };

  /** A window kind: size and slide in microseconds, its name, whether its open windows go out. */
  static final class Spec implements Serializable {
    private static final long serialVersionUID = 1L;
    final long size;
    final long slide;
    final String name;
    final boolean open;

    Spec(long sizeSeconds, long slideSeconds, String name, boolean open) {
      this.size = sizeSeconds * 1_000_000L;
      this.slide = slideSeconds * 1_000_000L;
      this.name = name;
      this.open = open;
    }

    /** The starts of this kind's windows that hold the pane starting at {@code pane}. */
    long[] holding(long pane) {
      long latest = pane - Math.floorMod(pane, slide);
      int count = (int) ((size + slide - 1) / slide);
      long[] starts = new long[count];
      int found = 0;
      for (int k = 0; k < count; k++) {
        long start = latest - k * slide;
        if (pane < start + size) {
          starts[found++] = start;
        }
      }
      return Arrays.copyOf(starts, found);
    }
  }

  /** Mergeable statistics: a pane's, or a window's of its panes. */
  static final class Stats {
    long n;
    double total;
    double squares;
    double min;
    double max;
    double last;
    long lastMicros = Long.MIN_VALUE;
    QuantileSketch sketch = new QuantileSketch();
    Double errors;
    long errorN;
    OffsetRanges ranges = new OffsetRanges();

    void add(Row summary) {
      long count = summary.getLong(N);
      double mean = summary.getDouble(MEAN);
      Stats part = new Stats();
      part.n = count;
      part.total = count * mean;
      part.squares = summary.getDouble(M2) + count * mean * mean;
      part.min = summary.getDouble(MIN);
      part.max = summary.getDouble(MAX);
      part.last = summary.getDouble(LAST);
      part.lastMicros = micros(summary.getTimestamp(LAST_TIME));
      part.sketch = QuantileSketch.fromBytes((byte[]) summary.get(SKETCH));
      part.errors = summary.isNullAt(ERRORS) ? null : summary.getDouble(ERRORS);
      part.errorN = summary.getLong(ERROR_N);
      PaneSummaries.addSources(part.ranges, summary.getStruct(SOURCES));
      add(part);
    }

    void add(Stats other) {
      if (n == 0) {
        min = other.min;
        max = other.max;
      } else {
        // Spark's ordering of doubles, as Double.compare's: NaN above every other value.
        min = Double.compare(other.min, min) < 0 ? other.min : min;
        max = Double.compare(other.max, max) > 0 ? other.max : max;
      }
      n += other.n;
      total += other.total;
      squares += other.squares;
      if (other.lastMicros > lastMicros) {
        last = other.last;
        lastMicros = other.lastMicros;
      }
      sketch.merge(other.sketch);
      if (other.errors != null) {
        errors = (errors == null ? 0.0 : errors) + other.errors;
      }
      errorN += other.errorN;
      ranges.addAll(other.ranges);
    }
  }

  /**
   * A series' state: its panes by start, and the watermark it was last closed through. Spark keeps
   * it as the bytes {@link #toBytes} writes: it reads every series' state in every micro-batch to
   * find those timed out, and reading them Java-serialized took 5% of a peak run's samples.
   */
  static final class Series {
    final TreeMap<Long, Stats> panes = new TreeMap<>();
    long closedThrough = Long.MIN_VALUE;

    byte[] toBytes() {
      try {
        ByteArrayOutputStream buffer = new ByteArrayOutputStream();
        DataOutputStream out = new DataOutputStream(buffer);
        out.writeLong(closedThrough);
        out.writeInt(panes.size());
        for (Map.Entry<Long, Stats> pane : panes.entrySet()) {
          Stats p = pane.getValue();
          out.writeLong(pane.getKey());
          out.writeLong(p.n);
          out.writeDouble(p.total);
          out.writeDouble(p.squares);
          out.writeDouble(p.min);
          out.writeDouble(p.max);
          out.writeDouble(p.last);
          out.writeLong(p.lastMicros);
          byte[] sketch = p.sketch.toBytes();
          out.writeInt(sketch.length);
          out.write(sketch);
          out.writeBoolean(p.errors != null);
          out.writeDouble(p.errors == null ? 0.0 : p.errors);
          out.writeLong(p.errorN);
          List<OffsetRange> ranges = p.ranges.getRanges();
          out.writeInt(ranges.size());
          for (OffsetRange r : ranges) {
            out.writeUTF(r.getTopic());
            out.writeInt(r.getPartition());
            out.writeLong(r.getMinOffset());
            out.writeLong(r.getMaxOffset());
            out.writeLong(r.getCount());
          }
        }
        out.flush();
        return buffer.toByteArray();
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }

    static Series fromBytes(byte[] bytes) {
      try {
        DataInputStream in = new DataInputStream(new ByteArrayInputStream(bytes));
        Series series = new Series();
        series.closedThrough = in.readLong();
        int count = in.readInt();
        for (int i = 0; i < count; i++) {
          long start = in.readLong();
          Stats p = new Stats();
          p.n = in.readLong();
          p.total = in.readDouble();
          p.squares = in.readDouble();
          p.min = in.readDouble();
          p.max = in.readDouble();
          p.last = in.readDouble();
          p.lastMicros = in.readLong();
          byte[] sketch = new byte[in.readInt()];
          in.readFully(sketch);
          p.sketch = QuantileSketch.fromBytes(sketch);
          boolean hasErrors = in.readBoolean();
          double errors = in.readDouble();
          p.errors = hasErrors ? errors : null;
          p.errorN = in.readLong();
          int ranges = in.readInt();
          for (int r = 0; r < ranges; r++) {
            p.ranges.add(in.readUTF(), in.readInt(), in.readLong(), in.readLong(), in.readLong());
          }
          series.panes.put(start, p);
        }
        return series;
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }
  }

  private final Spec[] specs;

  private WindowState(Spec[] specs) {
    this.specs = specs;
  }

  /**
   * Every window of {@code records} (the Kafka source's, with or without headers): {@code specs}
   * as {@code size:slide:name:open;...} (seconds; open 1 or 0), panes of {@code paneSeconds}, the
   * watermark {@code watermarkSeconds} behind the latest event time.
   */
  public static Dataset<Row> windows(
      Dataset<Row> records,
      String specs,
      long paneSeconds,
      long watermarkSeconds,
      String webMetric,
      String webUnit) {
    List<Spec> parsed = new ArrayList<>();
    for (String spec : specs.split(";")) {
      String[] parts = spec.split(":");
      parsed.add(
          new Spec(
              Long.parseLong(parts[0]),
              Long.parseLong(parts[1]),
              parts[2],
              parts[3].equals("1")));
    }
    Dataset<Row> summaries =
        PaneSummaries.summariseOrReject(records, paneSeconds, webMetric, webUnit)
            .withWatermark("event_time", watermarkSeconds + " seconds");
    StructType rejected = (StructType) summaries.schema().apply(REJECTED_AT).dataType();
    MapFunction<Row, Row> key =
        row ->
            row.isNullAt(REJECTED_AT)
                ? RowFactory.create(
                    row.getString(1), row.getString(2), row.getString(3), row.getString(4), false)
                : RowFactory.create(null, null, null, null, true);
    return summaries
        .groupByKey(key, Encoders.row(KEY))
        .flatMapGroupsWithState(
            new WindowState(parsed.toArray(new Spec[0])),
            OutputMode.Append(),
            Encoders.BINARY(),
            Encoders.row(output(rejected)),
            GroupStateTimeout.EventTimeTimeout());
  }

  @Override
  public Iterator<Row> call(Row key, Iterator<Row> values, GroupState<byte[]> state) {
    List<Row> out = new ArrayList<>();
    if (key.getBoolean(4)) {
      while (values.hasNext()) {
        out.add(rejectedRow(values.next().getStruct(REJECTED_AT)));
      }
      return out.iterator();
    }
    long watermark = state.getCurrentWatermarkMs() * 1000L;
    Series series = state.exists() ? Series.fromBytes(state.get()) : new Series();
    TreeSet<Long> changed = new TreeSet<>();
    while (values.hasNext()) {
      Row summary = values.next();
      long pane = micros(summary.getStruct(WINDOW).getTimestamp(0));
      series.panes.computeIfAbsent(pane, p -> new Stats()).add(summary);
      changed.add(pane);
    }
    for (Spec spec : specs) {
      if (!spec.open) {
        continue;
      }
      TreeSet<Long> starts = new TreeSet<>();
      for (long pane : changed) {
        for (long start : spec.holding(pane)) {
          if (start + spec.size > watermark) {
            starts.add(start);
          }
        }
      }
      for (long start : starts) {
        out.add(windowRow(key, OPEN, spec, start, series));
      }
    }
    long next = Long.MAX_VALUE;
    for (Spec spec : specs) {
      TreeSet<Long> closing = new TreeSet<>();
      for (long pane : series.panes.keySet()) {
        for (long start : spec.holding(pane)) {
          long end = start + spec.size;
          if (end > series.closedThrough && end <= watermark) {
            closing.add(start);
          } else if (end > watermark) {
            next = Math.min(next, end);
          }
        }
      }
      for (long start : closing) {
        out.add(windowRow(key, CLOSED, spec, start, series));
      }
    }
    series.closedThrough = Math.max(series.closedThrough, watermark);
    // A pane goes once every window that holds it has closed.
    series.panes.keySet().removeIf(pane -> lastEnd(pane) <= watermark);
    if (series.panes.isEmpty()) {
      state.remove();
    } else {
      state.update(series.toBytes());
      // Called again once the watermark reaches the next window's end (Spark times a
      // state out when the watermark passes its timestamp).
      state.setTimeoutTimestamp(next / 1000L - 1);
    }
    return out.iterator();
  }

  private long lastEnd(long pane) {
    long end = Long.MIN_VALUE;
    for (Spec spec : specs) {
      long latest = pane - Math.floorMod(pane, spec.slide);
      end = Math.max(end, latest + spec.size);
    }
    return end;
  }

  private static Row windowRow(Row key, String kind, Spec spec, long start, Series series) {
    Stats window = new Stats();
    for (Map.Entry<Long, Stats> pane :
        series.panes.subMap(start, true, start + spec.size, false).entrySet()) {
      window.add(pane.getValue());
    }
    double mean = window.total / window.n;
    return RowFactory.create(
        kind,
        RowFactory.create(
            DecodeObservations.timestamp(start), DecodeObservations.timestamp(start + spec.size)),
        spec.size / 1_000_000L,
        spec.slide / 1_000_000L,
        spec.name,
        key.getString(0),
        key.getString(1),
        key.getString(2),
        key.getString(3),
        window.n,
        mean,
        Math.max(window.squares - window.n * mean * mean, 0.0),
        window.min,
        window.max,
        window.last,
        DecodeObservations.timestamp(window.lastMicros),
        window.sketch.toBytes(),
        window.errors,
        window.errorN,
        PaneSummaries.sources(window.ranges),
        null);
  }

  private static Row rejectedRow(Row rejected) {
    // kind, window, size, slide, name, the window columns, then the rejected record.
    Object[] fields = new Object[5 + WINDOW_COLUMNS.length + 1];
    fields[0] = REJECTED;
    fields[fields.length - 1] = rejected;
    return RowFactory.create(fields);
  }

  static long micros(Timestamp at) {
    return Math.floorDiv(at.getTime(), 1000L) * 1_000_000L + at.getNanos() / 1000;
  }
}
