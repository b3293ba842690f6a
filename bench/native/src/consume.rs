//! Consume mode (`--consume 1`, raftline only): each partition followed by its own thread and
//! connection with long-poll fetches in batch format from its leader, end-to-end latency
//! tallied from each value's stamp as bench/tally.py does (its bucket scheme, its window).
//!
//! The parent (bench/native.py NativeConsumer) drives it over stdin, one command a line:
//! `window START_NS END_NS`, `progress`, `stop` (or end of input). It answers on stdout: `ready`
//! once connected, `progress N` (messages received so far), and at the end one JSON line with
//! the fields of bench/consumers.py's tally result.

use crate::histogram::Histogram;
use crate::raftline::Conn;
use crate::{batches, json_escape, monotonic_ns, Args};
use std::collections::HashMap;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

// As bench/drivers/raftline.py fetches: the node's largest max_messages, 1 MiB, 500 ms.
const FETCH_MAX_MESSAGES: usize = 100_000;
const FETCH_MAX_BYTES: usize = 1024 * 1024;
const FETCH_WAIT_MS: u64 = 500;
const BATCH_CONTENT_TYPE: &str = "application/vnd.raftline.batch";
/// A partition without a leader (an election) is asked again after this, for at most
/// UNAVAILABLE_TRIES tries in a row.
const UNAVAILABLE_PAUSE: Duration = Duration::from_millis(50);
const UNAVAILABLE_TRIES: u32 = 200;

/// What the parent sets and reads while the partition threads run.
#[derive(Default)]
struct Shared {
    window_start: AtomicU64,
    window_end: AtomicU64,
    received: AtomicU64,
    stop: AtomicBool,
}

#[derive(Default)]
struct Tally {
    received: u64,
    received_in_window: u64,
    e2e: Histogram,
    errors: u64,
    first_error: String,
}

impl Tally {
    fn on_error(&mut self, error: String) {
        self.errors += 1;
        if self.first_error.is_empty() {
            self.first_error = error;
        }
    }

    fn merge(&mut self, other: Tally) {
        self.received += other.received;
        self.received_in_window += other.received_in_window;
        self.e2e.merge(&other.e2e);
        self.errors += other.errors;
        if self.first_error.is_empty() {
            self.first_error = other.first_error;
        }
    }
}

/// One partition's reader: its position and connections by node port.
struct Follower {
    args: Arc<Args>,
    shared: Arc<Shared>,
    partition: usize,
    port: u16,
    offset: i64,
    conns: HashMap<u16, Conn>,
}

impl Follower {
    fn run(mut self) -> Tally {
        let mut tally = Tally::default();
        if let Err(error) = self.follow(&mut tally) {
            tally.on_error(format!("partition {}: {error}", self.partition));
        }
        tally
    }

    fn follow(&mut self, tally: &mut Tally) -> Result<(), String> {
        let mut unavailable = 0;
        while !self.shared.stop.load(Ordering::Relaxed) {
            let path = format!(
                "/v1/topics/{}/partitions/{}/messages?offset={}&max_messages={FETCH_MAX_MESSAGES}\
                 &max_bytes={FETCH_MAX_BYTES}&wait_ms={FETCH_WAIT_MS}",
                self.args.topic, self.partition, self.offset
            );
            let port = self.port;
            if !self.conns.contains_key(&port) {
                self.conns.insert(port, Conn::open(&self.args.host, port)?);
            }
            let conn = self.conns.get_mut(&port).unwrap();
            let accept = format!("Accept: {BATCH_CONTENT_TYPE}\r\n");
            let answer = conn.exchange("GET", &path, &accept, b"")?;
            let now = monotonic_ns();
            if answer.status_line.split(' ').nth(1) == Some("503")
                && unavailable < UNAVAILABLE_TRIES
            {
                unavailable += 1;
                std::thread::sleep(UNAVAILABLE_PAUSE);
                continue;
            }
            unavailable = 0;
            if !answer.ok() {
                return Err(answer.describe());
            }
            if answer.content_type.split(';').next() != Some(BATCH_CONTENT_TYPE) {
                // A node that is not the leader forwards and answers JSON, naming the leader:
                // ask the leader itself from now on.
                let leader = answer.leader.and_then(|id| {
                    self.args
                        .node_ports
                        .iter()
                        .find(|(n, _)| *n == id)
                        .map(|(_, p)| *p)
                });
                match leader {
                    Some(leader) if leader != self.port => {
                        self.port = leader;
                        continue;
                    }
                    _ => return Err(format!("a JSON answer: {}", answer.describe())),
                }
            }
            let next = answer
                .next_offset
                .ok_or("a batch answer without Raftline-Next-Offset")?;
            self.tally_values(&answer.body, now, tally)?;
            self.offset = self.offset.max(next);
        }
        Ok(())
    }

    /// Count the answer's values and record each one's latency from its stamp, messages with
    /// equal stamps (one batch's slot) recorded together, as bench/tally.py groups them.
    fn tally_values(&self, body: &[u8], now: u64, tally: &mut Tally) -> Result<(), String> {
        let (start, end) = (
            self.shared.window_start.load(Ordering::Relaxed),
            self.shared.window_end.load(Ordering::Relaxed),
        );
        let mut run: Option<(u64, u64)> = None; // (stamp, messages)
        let record = |stamp: u64, count: u64, tally: &mut Tally| {
            if stamp >= start && stamp < end {
                tally.e2e.record(now.saturating_sub(stamp) / 1000, count);
            }
        };
        let received = batches::each_value(body, self.offset, |_, value| {
            let Some(prefix) = value.get(..8) else {
                return; // no stamp: counted, not timed
            };
            let stamp = i64::from_le_bytes(prefix.try_into().unwrap()).max(0) as u64;
            match &mut run {
                Some((s, n)) if *s == stamp => *n += 1,
                _ => {
                    if let Some((s, n)) = run.replace((stamp, 1)) {
                        record(s, n, tally);
                    }
                }
            }
        })?;
        if let Some((s, n)) = run {
            record(s, n, tally);
        }
        tally.received += received;
        if now >= start && now < end {
            tally.received_in_window += received;
        }
        self.shared.received.fetch_add(received, Ordering::Relaxed);
        Ok(())
    }
}

pub fn run(args: Args) {
    let args = Arc::new(args);
    let shared = Arc::new(Shared::default());
    let mut followers = Vec::new();
    for partition in 0..args.partitions {
        let port = args.leaders.get(partition).copied().unwrap_or(args.port);
        let conn = match Conn::open(&args.host, port) {
            Ok(conn) => conn,
            Err(error) => {
                println!("{{\"error\": \"connect: {}\"}}", json_escape(&error));
                std::process::exit(1);
            }
        };
        followers.push(Follower {
            args: args.clone(),
            shared: shared.clone(),
            partition,
            port,
            offset: 0,
            conns: HashMap::from([(port, conn)]),
        });
    }
    let threads: Vec<_> = followers
        .into_iter()
        .map(|f| std::thread::spawn(move || f.run()))
        .collect();
    println!("ready");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["window", start, end] => {
                let (Ok(start), Ok(end)) = (start.parse(), end.parse()) else {
                    eprintln!("bad window command: {line}");
                    continue;
                };
                shared.window_start.store(start, Ordering::Relaxed);
                shared.window_end.store(end, Ordering::Relaxed);
            }
            ["progress"] => println!("progress {}", shared.received.load(Ordering::Relaxed)),
            ["stop"] => break,
            _ => eprintln!("unknown command: {line}"),
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    let mut tally = Tally::default();
    for thread in threads {
        match thread.join() {
            Ok(t) => tally.merge(t),
            Err(_) => tally.on_error("a partition thread panicked".into()),
        }
    }
    let empty = Histogram::default().json();
    println!(
        "{{\"received\": {}, \"received_in_window\": {}, \"errors\": {}, \"first_error\": \"{}\", \
         \"e2e_latency\": {}, \"received_latency\": {empty}, \"ack_sent_latency\": {empty}}}",
        tally.received,
        tally.received_in_window,
        tally.errors,
        json_escape(&tally.first_error),
        tally.e2e.json(),
    );
}
