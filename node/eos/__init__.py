"""Exactly-once cores: pure, I/O-free state machines applied from Raft logs (issue #15).

Owns the per-partition producer state, the transaction coordinator, producer id allocation,
transaction markers, partition-side transaction verification and the read_committed filter.
Nothing here reads a clock, a socket or a file: the runtime feeds committed entries and times.

How the runtime drives them (node/producers.py and node/partition.py for a partition;
node/transactions/ for the coordinator shards):
- Partition: apply_batch(kafka base offset, meta_of_batch(raw)) for every committed batch in
  order (Kafka offsets, never Raft indexes: Redpanda #5356); snapshot() with the log, restore()
  then replay from its next_offset. A leader calls check() only once it has applied the first
  entry of its own term, proposes a batch only on new, awaits the original on in_flight, answers
  duplicate with the offsets given, asks the coordinator (add_partitions) on needs_verification
  and checks again with verified=True, and calls clear_in_flight() on every term change. The
  LSO is last_stable_offset(high watermark); a read_committed fetch reads below it and filters
  with isolation.read_committed(batches, the log's aborted_txns(start, lso)): the node copies
  each abort apply_batch records into the segment's transaction index (raftlog/txnindex.py).
- Coordinator shard (shard_for(transactional id)): commands are logged dicts stamped with
  now_ms; a result carrying markers is written by build_marker to each partition (coordinator
  epoch = the shard's Raft term), offsets go to their groups, then markers_written is logged;
  a partition answering fenced to a marker has moved past it (count it as written). A new
  leader resends pending_markers(); a timer proposes abort_expired for each expire(now).
"""
