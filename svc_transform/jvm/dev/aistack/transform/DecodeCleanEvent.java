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
import org.apache.spark.sql.api.java.UDF1;

/**
 * aistack.v1.CleanEvent bytes to the row svc_transform aggregates (its schema is
 * svc_transform.functions.CLEAN_EVENT_SCHEMA, field for field). A record that
 * does not decode gives a row with only {@code error} set, never an exception:
 * the query dead-letters it and goes on. It parses with protoc's generated
 * class, which checks what DynamicMessage checks (the wire format, every
 * string's UTF-8, nested messages) at half its cost: every query decodes every
 * record, and DynamicMessage's reflection was a fifth of the job's samples.
 */
public final class DecodeCleanEvent implements UDF1<byte[], Row> {
  private static final long serialVersionUID = 1L;

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

  @Override
  public Row call(byte[] value) {
    CleanEvent event;
    try {
      event = parseValid(value);
    } catch (Invalid e) {
      return failed(e.getMessage());
    }
    String kind;
    List<Row> measurements = new ArrayList<>();
    Row web = null;
    if (event.hasSensorReading()) {
      kind = "sensor";
      for (Measurement m : event.getSensorReading().getMeasurementsList()) {
        measurements.add(RowFactory.create(m.getMetric(), m.getValue(), m.getUnit()));
      }
    } else {
      kind = "web";
      WebRequest r = event.getWebRequest();
      web =
          RowFactory.create(
              r.getHost(), r.getMethod(), r.getPath(), (long) r.getStatus(), r.getLatencyMs());
    }
    return RowFactory.create(
        event.getEventId(),
        event.getEntityId(),
        timestamp(event.getEventTime()),
        kind,
        measurements,
        web,
        null);
  }

  private static Timestamp timestamp(com.google.protobuf.Timestamp ts) {
    Timestamp out = new Timestamp(ts.getSeconds() * 1000L);
    out.setNanos(ts.getNanos());
    return out;
  }

  private static Row failed(String error) {
    return RowFactory.create(null, null, null, null, null, null, error);
  }
}
