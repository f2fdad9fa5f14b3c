package dev.aistack.transform;

import com.google.protobuf.ByteString;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.DynamicMessage;
import java.sql.Timestamp;
import java.time.Instant;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A Spark struct to the bytes of an aistack.v1 message, field by field by name:
 * a struct field the message lacks is an error, a message field the struct
 * lacks (or null) stays unset. Timestamps take Spark timestamps; Durations take
 * whole seconds; maps take Spark maps; repeated fields take arrays; nested
 * messages take structs.
 */
abstract class RowEncoder implements UDF1<Row, byte[]> {
  private static final long serialVersionUID = 1L;

  private final String messageName;
  private transient Descriptor descriptor;

  RowEncoder(String messageName) {
    this.messageName = messageName;
  }

  @Override
  public byte[] call(Row row) {
    if (row == null) {
      return null;
    }
    if (descriptor == null) {
      descriptor = Contracts.message(messageName);
    }
    return message(descriptor, row).toByteArray();
  }

  private static DynamicMessage message(Descriptor type, Row row) {
    DynamicMessage.Builder builder = DynamicMessage.newBuilder(type);
    StructType schema = row.schema();
    for (int i = 0; i < row.size(); i++) {
      String name = schema.fields()[i].name();
      FieldDescriptor field = type.findFieldByName(name);
      if (field == null) {
        throw new IllegalArgumentException(type.getFullName() + " has no field " + name);
      }
      if (row.isNullAt(i)) {
        continue;
      }
      Object value = row.get(i);
      if (field.isMapField()) {
        Descriptor entry = field.getMessageType();
        for (Map.Entry<?, ?> item : javaMap(value).entrySet()) {
          builder.addRepeatedField(
              field,
              DynamicMessage.newBuilder(entry)
                  .setField(entry.findFieldByName("key"), item.getKey())
                  .setField(entry.findFieldByName("value"), item.getValue())
                  .build());
        }
      } else if (field.isRepeated()) {
        for (Object item : javaList(value)) {
          builder.addRepeatedField(field, single(field, item));
        }
      } else {
        builder.setField(field, single(field, value));
      }
    }
    return builder.build();
  }

  private static Object single(FieldDescriptor field, Object value) {
    switch (field.getJavaType()) {
      case MESSAGE:
        Descriptor type = field.getMessageType();
        String name = type.getFullName();
        if (name.equals("google.protobuf.Timestamp")) {
          Instant at = value instanceof Timestamp ? ((Timestamp) value).toInstant() : (Instant) value;
          return DynamicMessage.newBuilder(type)
              .setField(type.findFieldByName("seconds"), at.getEpochSecond())
              .setField(type.findFieldByName("nanos"), at.getNano())
              .build();
        }
        if (name.equals("google.protobuf.Duration")) {
          return DynamicMessage.newBuilder(type)
              .setField(type.findFieldByName("seconds"), ((Number) value).longValue())
              .build();
        }
        return message(type, (Row) value);
      case INT:
        return ((Number) value).intValue();
      case LONG:
        return ((Number) value).longValue();
      case DOUBLE:
        return ((Number) value).doubleValue();
      case FLOAT:
        return ((Number) value).floatValue();
      case BYTE_STRING:
        return ByteString.copyFrom((byte[]) value);
      default:
        return value;
    }
  }

  private static Map<?, ?> javaMap(Object value) {
    if (value instanceof Map) {
      return (Map<?, ?>) value;
    }
    return CollectionConverters.asJava((scala.collection.Map<?, ?>) value);
  }

  private static List<?> javaList(Object value) {
    if (value instanceof List) {
      return (List<?>) value;
    }
    return CollectionConverters.asJava((scala.collection.Seq<?>) value);
  }
}
