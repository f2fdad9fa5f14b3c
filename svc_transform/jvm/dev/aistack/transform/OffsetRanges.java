package dev.aistack.transform;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;

/**
 * One {@link OffsetRange} per (topic, partition) seen: exact, and as large as
 * the number of partitions, never the number of records. A Java bean (Spark
 * encodes it as {@code struct<ranges: array<struct<...>>>}).
 */
public final class OffsetRanges implements Serializable {
  private static final long serialVersionUID = 1L;

  private List<OffsetRange> ranges = new ArrayList<>();

  public OffsetRanges() {}

  /** One record at {@code offset}. */
  void add(String topic, int partition, long offset) {
    add(topic, partition, offset, offset, 1);
  }

  void addAll(OffsetRanges other) {
    for (OffsetRange range : other.ranges) {
      add(
          range.getTopic(),
          range.getPartition(),
          range.getMinOffset(),
          range.getMaxOffset(),
          range.getCount());
    }
  }

  void add(String topic, int partition, long min, long max, long count) {
    // A linear scan: a window's events come from one partition, or a few.
    for (OffsetRange range : ranges) {
      if (range.holds(topic, partition)) {
        range.widen(min, max, count);
        return;
      }
    }
    ranges.add(new OffsetRange(topic, partition, min, max, count));
  }

  /** By topic, then partition: equal windows encode to equal bytes. */
  OffsetRanges sorted() {
    ranges.sort(
        Comparator.comparing(OffsetRange::getTopic).thenComparingInt(OffsetRange::getPartition));
    return this;
  }

  public List<OffsetRange> getRanges() {
    return ranges;
  }

  public void setRanges(List<OffsetRange> ranges) {
    // Spark may hand over a list it does not expect to change.
    this.ranges = new ArrayList<>(ranges);
  }
}
