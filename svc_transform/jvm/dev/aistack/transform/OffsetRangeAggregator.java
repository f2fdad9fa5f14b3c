package dev.aistack.transform;

import org.apache.spark.sql.Encoder;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.expressions.Aggregator;

/** An aggregate whose buffer and result are {@link OffsetRanges}. */
abstract class OffsetRangeAggregator<IN> extends Aggregator<IN, OffsetRanges, OffsetRanges> {
  private static final long serialVersionUID = 1L;

  @Override
  public final OffsetRanges zero() {
    return new OffsetRanges();
  }

  @Override
  public final OffsetRanges merge(OffsetRanges left, OffsetRanges right) {
    left.addAll(right);
    return left;
  }

  @Override
  public final OffsetRanges finish(OffsetRanges ranges) {
    return ranges.sorted();
  }

  @Override
  public final Encoder<OffsetRanges> bufferEncoder() {
    return Encoders.bean(OffsetRanges.class);
  }

  @Override
  public final Encoder<OffsetRanges> outputEncoder() {
    return Encoders.bean(OffsetRanges.class);
  }
}
