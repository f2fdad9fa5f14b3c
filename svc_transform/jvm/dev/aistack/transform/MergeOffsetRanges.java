package dev.aistack.transform;

/** Aggregate: {@link OffsetRanges} (nulls skipped) to the ranges of all their records. */
public final class MergeOffsetRanges extends OffsetRangeAggregator<OffsetRanges> {
  private static final long serialVersionUID = 1L;

  @Override
  public OffsetRanges reduce(OffsetRanges ranges, OffsetRanges more) {
    if (more != null) {
      ranges.addAll(more);
    }
    return ranges;
  }
}
