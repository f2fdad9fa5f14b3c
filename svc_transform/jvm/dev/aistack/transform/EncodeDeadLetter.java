package dev.aistack.transform;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF1;

/** A dead-letter struct to aistack.v1.DeadLetter bytes. */
// Spark looks for the UDF interface on the class itself, not its parents.
public final class EncodeDeadLetter extends RowEncoder implements UDF1<Row, byte[]> {
  private static final long serialVersionUID = 1L;

  public EncodeDeadLetter() {
    super("aistack.v1.DeadLetter");
  }
}
