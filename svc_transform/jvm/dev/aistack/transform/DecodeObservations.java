package dev.aistack.transform;

import aistack.v1.Events.CleanEvent;
import aistack.v1.Events.Measurement;
import aistack.v1.Events.WebRequest;
import com.google.protobuf.InvalidProtocolBufferException;
import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * aistack.v1.CleanEvent bytes to the observations svc_transform aggregates: one
 * per sensor measurement, one for a web request's latency (see {@link #OBSERVATION}).
 * A record that does not decode gives none, never an exception: the dead-letter
 * query ({@link CleanEventError}) says why. It parses with protoc's generated
 * class, which checks what DynamicMessage checks (the wire format, every
 * string's UTF-8, nested messages) at half its cost, and hands Spark the flat
 * rows the windows read and nothing else: every window query decodes every
 * record, and building the whole event as nested rows, then exploding it twice,
 * cost more than the parse.
 */
public final class DecodeObservations implements UDF1<byte[], List<Row>> {
  private static final long serialVersionUID = 1L;

  /** One value of one entity's metric (and path, for web requests) at an event time. */
  static final StructType OBSERVATION =
      new StructType()
          .add("entity_id", DataTypes.StringType)
          .add("event_time", DataTypes.TimestampType)
          .add("metric", DataTypes.StringType)
          .add("path", DataTypes.StringType)
          .add("unit", DataTypes.StringType)
          .add("value", DataTypes.DoubleType)
          // 1.0 for a web request that failed (status 500 or more), 0.0 for one
          // that did not; null for sensor values.
          .add("is_error", DataTypes.DoubleType);

  private final String webMetric;
  private final String webUnit;

  private DecodeObservations(String webMetric, String webUnit) {
    this.webMetric = webMetric;
    this.webUnit = webUnit;
  }

  /** Makes the function callable as {@code name}; web latencies are {@code webMetric} in {@code webUnit}. */
  public static void register(SparkSession spark, String name, String webMetric, String webUnit) {
    spark
        .udf()
        .register(
            name,
            new DecodeObservations(webMetric, webUnit),
            DataTypes.createArrayType(OBSERVATION, false));
  }

  /** Why a record is not a CleanEvent svc_transform can use. */
  static final class Invalid extends Exception {
    private static final long serialVersionUID = 1L;

    Invalid(String reason) {
      super(reason, null, false, false);
    }
  }

  /** The record as a CleanEvent with what the windows need, or why not. */
  static CleanEvent parseValid(byte[] value) throws Invalid {
    if (value == null) {
      throw new Invalid("record has no value");
    }
    CleanEvent event;
    try {
      event = CleanEvent.parseFrom(value);
    } catch (InvalidProtocolBufferException e) {
      throw new Invalid("not an aistack.v1.CleanEvent: " + e.getMessage());
    }
    if (!event.hasEventTime()) {
      throw new Invalid("CleanEvent has no event_time");
    }
    if (event.getEntityId().isEmpty()) {
      throw new Invalid("CleanEvent has no entity_id");
    }
    if (event.getBodyCase() == CleanEvent.BodyCase.BODY_NOT_SET) {
      throw new Invalid("CleanEvent has neither a sensor reading nor a web request");
    }
    return event;
  }

  /** Where {@link #observe} hands each observation. */
  interface Observer {
    /** One value; {@code isError} null for a sensor's, 1.0 or 0.0 for a web request's. */
    void accept(
        String entity, long micros, String metric, String path, String unit, double value, Double isError);
  }

  /**
   * {@code event}'s observations, each to {@code observer}: one per measurement of a sensor
   * reading, one (the latency, {@code webMetric} in {@code webUnit}) for a web request. The one
   * place an event becomes observations, for the Spark SQL rows ({@link #call}) and for the
   * windows' summaries ({@link PaneSummaries}) alike.
   */
  static void observe(CleanEvent event, String webMetric, String webUnit, Observer observer) {
    String entity = event.getEntityId();
    com.google.protobuf.Timestamp at = event.getEventTime();
    long micros = at.getSeconds() * 1_000_000L + at.getNanos() / 1000;
    if (event.hasSensorReading()) {
      for (Measurement m : event.getSensorReading().getMeasurementsList()) {
        observer.accept(entity, micros, m.getMetric(), "", m.getUnit(), m.getValue(), null);
      }
      return;
    }
    WebRequest r = event.getWebRequest();
    double failed = r.getStatus() >= 500 ? 1.0 : 0.0;
    observer.accept(entity, micros, webMetric, r.getPath(), webUnit, r.getLatencyMs(), failed);
  }

  @Override
  public List<Row> call(byte[] value) {
    CleanEvent event;
    try {
      event = parseValid(value);
    } catch (Invalid e) {
      return List.of();
    }
    List<Row> observed = new ArrayList<>(2);
    observe(
        event,
        webMetric,
        webUnit,
        (entity, micros, metric, path, unit, v, isError) ->
            observed.add(
                RowFactory.create(entity, timestamp(micros), metric, path, unit, v, isError)));
    return observed;
  }

  /** A timestamp for Spark from its microseconds since the epoch. */
  static Timestamp timestamp(long micros) {
    Timestamp at = new Timestamp(Math.floorDiv(micros, 1000L));
    at.setNanos((int) Math.floorMod(micros, 1_000_000L) * 1000);
    return at;
  }
}
