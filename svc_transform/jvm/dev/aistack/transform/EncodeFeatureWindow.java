package dev.aistack.transform;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF1;

/** A feature-window struct to aistack.v1.FeatureWindow bytes. */
// Spark looks for the UDF interface on the class itself, not its parents.
public final class EncodeFeatureWindow extends RowEncoder implements UDF1<Row, byte[]> {
  private static final long serialVersionUID = 1L;

  public EncodeFeatureWindow() {
    super("aistack.v1.FeatureWindow");
  }
}
