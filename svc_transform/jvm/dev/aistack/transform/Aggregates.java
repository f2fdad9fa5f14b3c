package dev.aistack.transform;

import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.functions;

/** Registers the aggregate functions, which pyspark cannot register from a class name. */
public final class Aggregates {
  private Aggregates() {}

  public static void register(SparkSession spark, String mergeSketches, String mergeOffsetRanges) {
    spark.udf().register(mergeSketches, functions.udaf(new MergeSketches(), Encoders.BINARY()));
    // Called with the ``ranges`` field of another's result.
    spark
        .udf()
        .register(
            mergeOffsetRanges,
            functions.udaf(new MergeOffsetRanges(), Encoders.bean(OffsetRanges.class)));
  }
}
