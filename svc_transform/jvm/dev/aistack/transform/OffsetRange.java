package dev.aistack.transform;

import java.io.Serializable;

/**
 * The clean events of one Kafka partition under a window: their least and
 * greatest offsets and how many there are (aistack.v1.OffsetRange). A Java
 * bean, so that Spark encodes it as a struct.
 */
public final class OffsetRange implements Serializable {
  private static final long serialVersionUID = 1L;

  private String topic;
  private int partition;
  private long minOffset;
  private long maxOffset;
  private long count;

  public OffsetRange() {}

  OffsetRange(String topic, int partition, long minOffset, long maxOffset, long count) {
    this.topic = topic;
    this.partition = partition;
    this.minOffset = minOffset;
    this.maxOffset = maxOffset;
    this.count = count;
  }

  boolean holds(String otherTopic, int otherPartition) {
    return partition == otherPartition && topic.equals(otherTopic);
  }

  void widen(long otherMin, long otherMax, long otherCount) {
    minOffset = Math.min(minOffset, otherMin);
    maxOffset = Math.max(maxOffset, otherMax);
    count += otherCount;
  }

  public String getTopic() {
    return topic;
  }

  public void setTopic(String topic) {
    this.topic = topic;
  }

  public int getPartition() {
    return partition;
  }

  public void setPartition(int partition) {
    this.partition = partition;
  }

  public long getMinOffset() {
    return minOffset;
  }

  public void setMinOffset(long minOffset) {
    this.minOffset = minOffset;
  }

  public long getMaxOffset() {
    return maxOffset;
  }

  public void setMaxOffset(long maxOffset) {
    this.maxOffset = maxOffset;
  }

  public long getCount() {
    return count;
  }

  public void setCount(long count) {
    this.count = count;
  }
}
