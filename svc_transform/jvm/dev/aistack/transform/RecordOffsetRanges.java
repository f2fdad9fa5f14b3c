package dev.aistack.transform;

import scala.Tuple3;

/** Aggregate: Kafka records' (topic, partition, offset) to their {@link OffsetRanges}. */
public final class RecordOffsetRanges extends OffsetRangeAggregator<Tuple3<String, Integer, Long>> {
  private static final long serialVersionUID = 1L;

  @Override
  public OffsetRanges reduce(OffsetRanges ranges, Tuple3<String, Integer, Long> record) {
    ranges.add(record._1(), record._2(), record._3());
    return ranges;
  }
}
