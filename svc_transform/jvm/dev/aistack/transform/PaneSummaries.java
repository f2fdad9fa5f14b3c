package dev.aistack.transform;

import aistack.v1.Events.CleanEvent;
import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Kafka records of clean events to one summary per (pane, entity, metric, path, unit) of a
 * partition, in one pass: each record parsed and its observations ({@link
 * DecodeObservations#observe}) folded into the statistics the windows merge (count, mean and
 * squared deviations, min, max, last, a quantile sketch, errors, each Kafka partition's offset
 * range). Spark's streaming aggregation then merges a few summaries per task, where it ran eleven
 * aggregate functions over every observation, two of them typed (an object per row, and a sort
 * past 128 groups), after the observations were built as rows, converted and exploded: what
 * Spark's own partial aggregation does, without its per-row machinery. A record that is not a
 * usable CleanEvent gives nothing ({@link #summarise}), or a row of its own that says why and
 * carries the record ({@link #summariseOrReject}: the single query's operator, {@link
 * WindowState}, passes it on to be dead-lettered).
 */
public final class PaneSummaries implements MapPartitionsFunction<Row, Row> {
  private static final long serialVersionUID = 1L;

  /** The Kafka source's columns read, in this order. */
  private static final String[] INPUT = {"value", "topic", "partition", "offset"};

  /** An {@link OffsetRange} as Spark encodes the bean (its fields by name), which the merge reads. */
  private static final StructType RANGE = Encoders.bean(OffsetRange.class).schema();

  private static final int RANGE_TOPIC = RANGE.fieldIndex("topic");
  private static final int RANGE_PARTITION = RANGE.fieldIndex("partition");
  private static final int RANGE_MIN = RANGE.fieldIndex("minOffset");
  private static final int RANGE_MAX = RANGE.fieldIndex("maxOffset");
  private static final int RANGE_COUNT = RANGE.fieldIndex("count");

  /**
   * A summary: the pane's {@code window}, the dimensions, the statistics under the names the
   * windows' merge reads, and {@code event_time}, its latest event's (the watermark's column).
   */
  static final StructType SUMMARY =
      new StructType()
          .add(
              "window",
              new StructType()
                  .add("start", DataTypes.TimestampType)
                  .add("end", DataTypes.TimestampType))
          .add("entity_id", DataTypes.StringType)
          .add("metric", DataTypes.StringType)
          .add("path", DataTypes.StringType)
          .add("unit", DataTypes.StringType)
          .add("n", DataTypes.LongType)
          .add("mean", DataTypes.DoubleType)
          .add("m2", DataTypes.DoubleType)
          .add("min", DataTypes.DoubleType)
          .add("max", DataTypes.DoubleType)
          .add("last", DataTypes.DoubleType)
          .add("last_event_time", DataTypes.TimestampType)
          .add("sketch", DataTypes.BinaryType)
          .add("errors", DataTypes.DoubleType)
          .add("error_n", DataTypes.LongType)
          .add(
              "sources",
              new StructType().add("ranges", DataTypes.createArrayType(RANGE, false)))
          .add("event_time", DataTypes.TimestampType);

  /** The record columns a rejected record carries, in {@link #REJECTED}'s order after its error. */
  private static final String[] RECORD = {"key", "value", "headers", "topic", "partition", "offset"};

  /**
   * The column of {@link #summariseOrReject}'s rows that holds a rejected record: why ({@code
   * error}) and the Kafka record as read; null on a summary, whose own columns are null here.
   */
  public static final String REJECTED = "rejected";

  private final long paneMicros;
  private final String webMetric;
  private final String webUnit;
  // Where the read holds key and headers (summariseOrReject), -1 elsewhere.
  private final int keyAt;
  private final int headersAt;

  private PaneSummaries(long paneMicros, String webMetric, String webUnit, boolean rejects) {
    this.paneMicros = paneMicros;
    this.webMetric = webMetric;
    this.webUnit = webUnit;
    this.keyAt = rejects ? INPUT.length : -1;
    this.headersAt = rejects ? INPUT.length + 1 : -1;
  }

  /**
   * The summaries ({@link #SUMMARY}) of {@code records}' observations per {@code
   * paneSeconds}-long tumbling pane; web latencies are {@code webMetric} in {@code webUnit}.
   */
  public static Dataset<Row> summarise(
      Dataset<Row> records, long paneSeconds, String webMetric, String webUnit) {
    return records
        .selectExpr(INPUT)
        .mapPartitions(
            new PaneSummaries(paneSeconds * 1_000_000L, webMetric, webUnit, false),
            Encoders.row(SUMMARY));
  }

  /**
   * {@link #summarise}'s summaries, and for each record that is not a usable CleanEvent a row whose
   * {@link #REJECTED} column holds why ({@code error}, as {@link CleanEventError} says it) and the
   * record ({@code key}, {@code value}, {@code headers}, {@code topic}, {@code partition}, {@code
   * offset}): {@code records} are the Kafka source's, read with headers or without (then none).
   */
  public static Dataset<Row> summariseOrReject(
      Dataset<Row> records, long paneSeconds, String webMetric, String webUnit) {
    if (!Arrays.asList(records.columns()).contains("headers")) {
      // Read without them (turning every record's headers into rows costs a tenth of a
      // read): a rejected record's are read again where it is dead-lettered.
      records =
          records.selectExpr(
              "*", "CAST(NULL AS ARRAY<STRUCT<key: STRING, value: BINARY>>) AS headers");
    }
    StructType read = records.schema();
    StructType rejected = new StructType().add("error", DataTypes.StringType);
    for (String column : RECORD) {
      rejected = rejected.add(read.apply(column));
    }
    String[] columns = new String[INPUT.length + 2];
    System.arraycopy(INPUT, 0, columns, 0, INPUT.length);
    columns[INPUT.length] = "key";
    columns[INPUT.length + 1] = "headers";
    return records
        .selectExpr(columns)
        .mapPartitions(
            new PaneSummaries(paneSeconds * 1_000_000L, webMetric, webUnit, true),
            Encoders.row(SUMMARY.add(REJECTED, rejected, true)));
  }

  /**
   * A group, its hash computed once: as a Java record its equals alone took 4.6% of a peak
   * run's samples (a flight recording, 2026-12-07).
   */
  private static final class Key {
    final long pane;
    final String entity;
    final String metric;
    final String path;
    final String unit;
    private final int hash;

    Key(long pane, String entity, String metric, String path, String unit) {
      this.pane = pane;
      this.entity = entity;
      this.metric = metric;
      this.path = path;
      this.unit = unit;
      int h = Long.hashCode(pane);
      h = 31 * h + entity.hashCode();
      h = 31 * h + metric.hashCode();
      h = 31 * h + path.hashCode();
      this.hash = 31 * h + unit.hashCode();
    }

    @Override
    public int hashCode() {
      return hash;
    }

    @Override
    public boolean equals(Object other) {
      if (!(other instanceof Key)) {
        return false;
      }
      Key k = (Key) other;
      return hash == k.hash
          && pane == k.pane
          && entity.equals(k.entity)
          && metric.equals(k.metric)
          && path.equals(k.path)
          && unit.equals(k.unit);
    }
  }

  /** One group's statistics, updated as Spark's own aggregates update theirs. */
  private static final class Summary {
    long n;
    double sum;
    // Welford's, as Spark's var_samp (CentralMomentAgg) keeps it.
    double avg;
    double m2;
    double min;
    double max;
    double last;
    long lastMicros;
    final QuantileSketch sketch = new QuantileSketch();
    double errors;
    long errorN;
    final OffsetRanges ranges = new OffsetRanges();

    void add(double value, long micros) {
      if (n == 0) {
        min = value;
        max = value;
        last = value;
        lastMicros = micros;
      } else {
        // Spark's ordering of doubles: NaN above every other value.
        if (Double.compare(value, min) < 0 && !Double.isNaN(value)) {
          min = value;
        }
        if (Double.isNaN(value) || (!Double.isNaN(max) && value > max)) {
          max = value;
        }
        // max_by: the first of the latest keeps it.
        if (micros > lastMicros) {
          last = value;
          lastMicros = micros;
        }
      }
      n++;
      sum += value;
      double delta = value - avg;
      double deltaN = delta / n;
      avg += deltaN;
      m2 += delta * (delta - deltaN);
      sketch.add(value);
    }
  }

  @Override
  public Iterator<Row> call(Iterator<Row> records) {
    Map<Key, Summary> groups = new HashMap<>();
    List<Row> out = new ArrayList<>();
    while (records.hasNext()) {
      Row record = records.next();
      CleanEvent event;
      try {
        event = DecodeObservations.parseValid(record.isNullAt(0) ? null : (byte[]) record.get(0));
      } catch (DecodeObservations.Invalid e) {
        if (keyAt >= 0) {
          out.add(rejected(record, e.getMessage()));
        }
        continue;
      }
      String topic = record.getString(1);
      int partition = record.getInt(2);
      long offset = record.getLong(3);
      DecodeObservations.observe(
          event,
          webMetric,
          webUnit,
          (entity, micros, metric, path, unit, value, isError) -> {
            long pane = micros - Math.floorMod(micros, paneMicros);
            Summary summary =
                groups.computeIfAbsent(
                    new Key(pane, entity, metric, path, unit), k -> new Summary());
            summary.add(value, micros);
            if (isError != null) {
              summary.errors += isError;
              summary.errorN++;
            }
            summary.ranges.add(topic, partition, offset);
          });
    }
    for (Map.Entry<Key, Summary> group : groups.entrySet()) {
      out.add(row(group.getKey(), group.getValue()));
    }
    return out.iterator();
  }

  /** {@code ranges} as a summary's {@code sources} column ({@code struct<ranges: ...>}), sorted. */
  static Row sources(OffsetRanges ranges) {
    List<Row> rows = new ArrayList<>();
    for (OffsetRange r : ranges.sorted().getRanges()) {
      Object[] fields = new Object[RANGE.size()];
      fields[RANGE_TOPIC] = r.getTopic();
      fields[RANGE_PARTITION] = r.getPartition();
      fields[RANGE_MIN] = r.getMinOffset();
      fields[RANGE_MAX] = r.getMaxOffset();
      fields[RANGE_COUNT] = r.getCount();
      rows.add(RowFactory.create(fields));
    }
    return RowFactory.create(CollectionConverters.asScala(rows).toSeq());
  }

  /** A summary's {@code sources} column ({@link #sources}) added to {@code ranges}. */
  static void addSources(OffsetRanges ranges, Row sources) {
    for (Row r : sources.<Row>getList(0)) {
      ranges.add(
          r.getString(RANGE_TOPIC),
          r.getInt(RANGE_PARTITION),
          r.getLong(RANGE_MIN),
          r.getLong(RANGE_MAX),
          r.getLong(RANGE_COUNT));
    }
  }

  /** A rejected record's row: every summary column null, then why and the record. */
  private Row rejected(Row record, String error) {
    Object[] fields = new Object[SUMMARY.size() + 1];
    fields[SUMMARY.size()] =
        RowFactory.create(
            error,
            record.get(keyAt),
            record.get(0),
            record.get(headersAt),
            record.get(1),
            record.get(2),
            record.get(3));
    return RowFactory.create(fields);
  }

  private Row row(Key key, Summary s) {
    Timestamp last = DecodeObservations.timestamp(s.lastMicros);
    Row window =
        RowFactory.create(
            DecodeObservations.timestamp(key.pane),
            DecodeObservations.timestamp(key.pane + paneMicros));
    Object[] fields = {
      window,
      key.entity,
      key.metric,
      key.path,
      key.unit,
      s.n,
      s.sum / s.n,
      s.n > 1 ? s.m2 : 0.0,
      s.min,
      s.max,
      s.last,
      last,
      s.sketch.toBytes(),
      s.errorN > 0 ? s.errors : null,
      s.errorN,
      sources(s.ranges),
      last
    };
    if (keyAt < 0) {
      return RowFactory.create(fields);
    }
    // summariseOrReject's rows end with the rejected record's column, null on a summary.
    return RowFactory.create(Arrays.copyOf(fields, fields.length + 1));
  }
}
