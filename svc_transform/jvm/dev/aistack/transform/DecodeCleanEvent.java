package dev.aistack.transform;

import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.DynamicMessage;
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
 * the query dead-letters it and goes on.
 */
public final class DecodeCleanEvent implements UDF1<byte[], Row> {
  private static final long serialVersionUID = 1L;

  private static final Descriptor EVENT = Contracts.message("aistack.v1.CleanEvent");
  private static final FieldDescriptor EVENT_ID = EVENT.findFieldByName("event_id");
  private static final FieldDescriptor ENTITY_ID = EVENT.findFieldByName("entity_id");
  private static final FieldDescriptor EVENT_TIME = EVENT.findFieldByName("event_time");
  private static final FieldDescriptor SENSOR = EVENT.findFieldByName("sensor_reading");
  private static final FieldDescriptor WEB = EVENT.findFieldByName("web_request");
  private static final Descriptor READING = SENSOR.getMessageType();
  private static final FieldDescriptor MEASUREMENTS = READING.findFieldByName("measurements");
  private static final Descriptor MEASUREMENT = MEASUREMENTS.getMessageType();
  private static final Descriptor REQUEST = WEB.getMessageType();
  private static final Descriptor TIMESTAMP = EVENT_TIME.getMessageType();
  // Looked up once: findFieldByName builds and hashes the field's full name
  // on every call, 3.5% of svc_transform's executor samples at its peak when
  // it ran per field of every record.
  private static final FieldDescriptor METRIC = MEASUREMENT.findFieldByName("metric");
  private static final FieldDescriptor VALUE = MEASUREMENT.findFieldByName("value");
  private static final FieldDescriptor UNIT = MEASUREMENT.findFieldByName("unit");
  private static final FieldDescriptor HOST = REQUEST.findFieldByName("host");
  private static final FieldDescriptor METHOD = REQUEST.findFieldByName("method");
  private static final FieldDescriptor PATH = REQUEST.findFieldByName("path");
  private static final FieldDescriptor STATUS = REQUEST.findFieldByName("status");
  private static final FieldDescriptor LATENCY_MS = REQUEST.findFieldByName("latency_ms");
  private static final FieldDescriptor SECONDS = TIMESTAMP.findFieldByName("seconds");
  private static final FieldDescriptor NANOS = TIMESTAMP.findFieldByName("nanos");

  /** Why a record is not a CleanEvent svc_transform can use. */
  static final class Invalid extends Exception {
    private static final long serialVersionUID = 1L;

    Invalid(String reason) {
      super(reason, null, false, false);
    }
  }

  /** The record as a CleanEvent with what the windows need, or why not. */
  static DynamicMessage parseValid(byte[] value) throws Invalid {
    if (value == null) {
      throw new Invalid("record has no value");
    }
    DynamicMessage event;
    try {
      event = DynamicMessage.parseFrom(EVENT, value);
    } catch (InvalidProtocolBufferException e) {
      throw new Invalid("not an aistack.v1.CleanEvent: " + e.getMessage());
    }
    if (!event.hasField(EVENT_TIME)) {
      throw new Invalid("CleanEvent has no event_time");
    }
    if (((String) event.getField(ENTITY_ID)).isEmpty()) {
      throw new Invalid("CleanEvent has no entity_id");
    }
    if (!event.hasField(SENSOR) && !event.hasField(WEB)) {
      throw new Invalid("CleanEvent has neither a sensor reading nor a web request");
    }
    return event;
  }

  @Override
  public Row call(byte[] value) {
    DynamicMessage event;
    try {
      event = parseValid(value);
    } catch (Invalid e) {
      return failed(e.getMessage());
    }
    String entity = (String) event.getField(ENTITY_ID);
    Timestamp eventTime = timestamp((DynamicMessage) event.getField(EVENT_TIME));
    String kind;
    List<Row> measurements = new ArrayList<>();
    Row web = null;
    if (event.hasField(SENSOR)) {
      kind = "sensor";
      DynamicMessage reading = (DynamicMessage) event.getField(SENSOR);
      for (Object item : (List<?>) reading.getField(MEASUREMENTS)) {
        DynamicMessage m = (DynamicMessage) item;
        measurements.add(RowFactory.create(m.getField(METRIC), m.getField(VALUE), m.getField(UNIT)));
      }
    } else {
      kind = "web";
      DynamicMessage r = (DynamicMessage) event.getField(WEB);
      web =
          RowFactory.create(
              r.getField(HOST),
              r.getField(METHOD),
              r.getField(PATH),
              ((Integer) r.getField(STATUS)).longValue(),
              r.getField(LATENCY_MS));
    }
    return RowFactory.create(
        event.getField(EVENT_ID), entity, eventTime, kind, measurements, web, null);
  }

  private static Timestamp timestamp(DynamicMessage ts) {
    long seconds = (Long) ts.getField(SECONDS);
    int nanos = (Integer) ts.getField(NANOS);
    Timestamp out = new Timestamp(seconds * 1000L);
    out.setNanos(nanos);
    return out;
  }

  private static Row failed(String error) {
    return RowFactory.create(null, null, null, null, null, null, error);
  }
}
