package dev.aistack.transform;

import org.apache.spark.sql.api.java.UDF1;

/**
 * Why a record is not a usable aistack.v1.CleanEvent, or null when it is: the
 * dead-letter query's test, the same as {@link DecodeObservations}'s, without
 * building the row it does not need.
 */
public final class CleanEventError implements UDF1<byte[], String> {
  private static final long serialVersionUID = 1L;

  @Override
  public String call(byte[] value) {
    try {
      DecodeObservations.parseValid(value);
      return null;
    } catch (DecodeObservations.Invalid e) {
      return e.getMessage();
    }
  }
}
