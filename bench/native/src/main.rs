//! Native publish load generator for Raftline and its peers (`python -m bench compare --native`),
//! with a consume mode for Raftline (consume.rs).
//!
//! Owns the command line, the worker threads (one connection and one batch in flight each),
//! the max-rate and fixed-rate schedules, and the JSON result: totals, publish-ack latency
//! percentiles and a per-second timeline. Each protocol module owns its publish path only;
//! topics are created and deleted by the Python drivers around a run.

mod amqp;
mod batches;
mod consume;
mod histogram;
mod nats;
mod raftline;
mod redis;
mod rmq_stream;
mod wire;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Sends one batch of `count` messages to a partition and returns once all are acknowledged.
pub trait Publisher: Send {
    fn publish(&mut self, partition: usize, count: usize) -> Result<(), String>;

    /// The same with each message's first 8 bytes its intended send time (CLOCK_MONOTONIC ns,
    /// little-endian, as bench/pacing.py stamps them): `stamps` are (time, messages) in order.
    fn publish_stamped(&mut self, _partition: usize, _stamps: &[(u64, u32)]) -> Result<(), String> {
        Err("this system's publisher does not stamp messages".into())
    }
}

/// Intended send times are stamped rounded down to this (bench/pacing.py STAMP_RESOLUTION_NS).
const STAMP_RESOLUTION_NS: u64 = 100_000;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// CLOCK_MONOTONIC in ns: the clock Python's time.monotonic_ns() reads, shared by the host.
fn monotonic_ns() -> u64 {
    const CLOCK_MONOTONIC: i32 = 1;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC exists on every Linux.
    unsafe { clock_gettime(CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[derive(Clone, Debug)]
pub struct Args {
    pub system: String,
    pub host: String,
    pub port: u16,
    pub topic: String,
    pub partitions: usize,
    pub message_size: usize,
    pub batch: usize,
    pub in_flight: usize,
    pub seconds: f64,
    pub warmup: f64,
    pub rate: f64,
    pub max_messages: u64,
    pub replicas: usize,
    pub acks: String,
    pub linger_ms: f64,
    /// Redis: XADD MAXLEN ~ this (0: no trimming).
    pub maxlen: u64,
    /// CLOCK_MONOTONIC ns the schedule starts at (0: 100 ms from now).
    pub start_ns: u64,
    /// Stamp every message with its intended send time and, at a fixed rate, send a batch when
    /// its last message is due, as the Python runner does (raftline only).
    pub stamp: bool,
    /// Raftline: the HTTP port of each partition's leader, in partition order.
    pub leaders: Vec<u16>,
    /// Raftline: node id -> HTTP port, to follow a forwarded answer's `Raftline-Leader`.
    pub node_ports: Vec<(u64, u16)>,
    /// Consume every partition instead of publishing (raftline only; consume.rs).
    pub consume: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: raftline-loadgen --system raftline|raftline-json|nats|rabbitmq-quorum|\
         rabbitmq-stream|redis --port N --topic T [--host H] [--partitions P] \
         [--message-size B] [--batch N] [--in-flight N] [--seconds S] [--warmup S] \
         [--rate MSGS_PER_S (0 = max)] [--max-messages N] [--replicas R] [--acks all|leader|none] \
         [--linger-ms MS] [--maxlen N (redis)] [--start-ns CLOCK_MONOTONIC_NS] \
         [--stamp 1 (raftline)] [--leaders PORT,... (raftline, per partition)] \
         [--node-ports ID=PORT,... (raftline)] [--consume 1 (raftline)]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        system: String::new(),
        host: "127.0.0.1".into(),
        port: 0,
        topic: String::new(),
        partitions: 1,
        message_size: 1024,
        batch: 1000,
        in_flight: 8,
        seconds: 10.0,
        warmup: 0.0,
        rate: 0.0,
        max_messages: 0,
        replicas: 1,
        acks: "all".into(),
        linger_ms: 5.0,
        maxlen: 0,
        start_ns: 0,
        stamp: false,
        leaders: Vec::new(),
        node_ports: Vec::new(),
        consume: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_else(|| usage());
        let number = |v: &str| v.parse::<f64>().unwrap_or_else(|_| usage());
        match argv[i].as_str() {
            "--system" => a.system = value,
            "--host" => a.host = value,
            "--port" => a.port = number(&value) as u16,
            "--topic" => a.topic = value,
            "--partitions" => a.partitions = number(&value) as usize,
            "--message-size" => a.message_size = number(&value) as usize,
            "--batch" => a.batch = number(&value) as usize,
            "--in-flight" => a.in_flight = number(&value) as usize,
            "--seconds" => a.seconds = number(&value),
            "--warmup" => a.warmup = number(&value),
            "--rate" => a.rate = number(&value),
            "--max-messages" => a.max_messages = number(&value) as u64,
            "--replicas" => a.replicas = number(&value) as usize,
            "--acks" => a.acks = value,
            "--linger-ms" => a.linger_ms = number(&value),
            "--maxlen" => a.maxlen = number(&value) as u64,
            "--start-ns" => a.start_ns = value.parse().unwrap_or_else(|_| usage()),
            "--stamp" => a.stamp = value == "1",
            "--consume" => a.consume = value == "1",
            "--leaders" => {
                a.leaders = value
                    .split(',')
                    .map(|p| p.parse().unwrap_or_else(|_| usage()))
                    .collect()
            }
            "--node-ports" => {
                a.node_ports = value
                    .split(',')
                    .map(|item| {
                        let (id, port) = item.split_once('=').unwrap_or_else(|| usage());
                        (
                            id.parse().unwrap_or_else(|_| usage()),
                            port.parse().unwrap_or_else(|_| usage()),
                        )
                    })
                    .collect()
            }
            _ => usage(),
        }
        i += 2;
    }
    if a.system.is_empty() || a.port == 0 || a.topic.is_empty() || a.partitions == 0 {
        usage();
    }
    if a.batch == 0 || a.in_flight == 0 || a.message_size < 8 || a.seconds <= 0.0 {
        usage();
    }
    if (a.stamp || a.consume) && a.system != "raftline" {
        usage();
    }
    a
}

fn connect(args: &Args, worker: usize) -> Result<Box<dyn Publisher>, String> {
    Ok(match args.system.as_str() {
        "raftline" => Box::new(raftline::Raftline::connect(args, false)?),
        "raftline-json" => Box::new(raftline::Raftline::connect(args, true)?),
        "nats" => Box::new(nats::Nats::connect(args, worker)?),
        "redis" => Box::new(redis::Redis::connect(args)?),
        "rabbitmq-stream" => Box::new(rmq_stream::Stream::connect(args)?),
        "rabbitmq-quorum" => Box::new(amqp::Amqp::connect(args)?),
        other => return Err(format!("unknown system {other}")),
    })
}

/// One acknowledged batch: when it was due and acknowledged (µs since the start), and its size.
#[derive(Clone, Copy)]
struct Ack {
    intended_us: u64,
    acked_us: u64,
    count: u32,
}

struct Shared {
    args: Args,
    start: Instant,
    /// `start` on CLOCK_MONOTONIC, in ns (what stamps count from).
    start_ns: u64,
    next_batch: AtomicU64,
    stop: AtomicBool,
    batch: usize,
}

struct WorkerResult {
    acks: Vec<Ack>,
    errors: u64,
    first_error: String,
}

fn worker(
    shared: Arc<Shared>,
    mut publisher: Box<dyn Publisher>,
    ready: Arc<Barrier>,
) -> WorkerResult {
    let args = &shared.args;
    let end = shared.start + Duration::from_secs_f64(args.warmup + args.seconds);
    let mut out = WorkerResult {
        acks: Vec::new(),
        errors: 0,
        first_error: String::new(),
    };
    ready.wait();
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let k = shared.next_batch.fetch_add(1, Ordering::Relaxed);
        let b = shared.batch as u64;
        if args.max_messages > 0 && k * b >= args.max_messages {
            shared.stop.store(true, Ordering::Relaxed);
            break;
        }
        let first = k * b;
        let intended = if args.stamp && args.rate > 0.0 {
            // Sent once its last message is due (the Python runner's linger): no message
            // goes out before its intended time.
            let last_due =
                shared.start + Duration::from_secs_f64((first + b - 1) as f64 / args.rate);
            let now = Instant::now();
            if last_due > now {
                std::thread::sleep(last_due - now);
            }
            shared.start + Duration::from_secs_f64(first as f64 / args.rate)
        } else if args.rate > 0.0 {
            // Batch k holds the messages due from this moment on: coordinated-omission safe,
            // a late send counts its whole delay.
            let due = shared.start + Duration::from_secs_f64((k * b) as f64 / args.rate);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            due
        } else {
            Instant::now().max(shared.start)
        };
        if intended >= end {
            break;
        }
        while Instant::now() < shared.start {
            std::thread::sleep(shared.start - Instant::now());
        }
        let stamps = if !args.stamp {
            Vec::new()
        } else if args.rate > 0.0 {
            stamp_groups(shared.start_ns, args.rate, first, b)
        } else {
            // At max rate a batch is due when it is sent, as in the Python runner: one stamp.
            let sent_ns = shared.start_ns + (intended - shared.start).as_nanos() as u64;
            vec![(sent_ns, b as u32)]
        };
        let partition = (k % args.partitions as u64) as usize;
        let sent = if args.stamp {
            publisher.publish_stamped(partition, &stamps)
        } else {
            publisher.publish(partition, shared.batch)
        };
        match sent {
            Ok(()) => {
                let acked_us = (Instant::now() - shared.start).as_micros() as u64;
                if args.stamp {
                    // Each message counts from its own intended time, as in the Python runner.
                    for (stamp, count) in &stamps {
                        out.acks.push(Ack {
                            intended_us: (stamp - shared.start_ns) / 1000,
                            acked_us,
                            count: *count,
                        });
                    }
                } else {
                    out.acks.push(Ack {
                        intended_us: (intended - shared.start).as_micros() as u64,
                        acked_us,
                        count: shared.batch as u32,
                    });
                }
            }
            Err(error) => {
                out.errors += 1;
                if out.first_error.is_empty() {
                    out.first_error = error;
                }
                break; // the connection's state is unknown after a failed batch
            }
        }
    }
    out
}

/// Messages first..first+count of a fixed-rate schedule grouped by intended time, rounded down
/// to STAMP_RESOLUTION_NS (bench/pacing.py FixedRateSchedule.stamp_groups).
fn stamp_groups(start_ns: u64, rate: f64, first: u64, count: u64) -> Vec<(u64, u32)> {
    let mut groups: Vec<(u64, u32)> = Vec::new();
    for i in first..first + count {
        let offset = (i as f64 * 1e9 / rate) as u64;
        let stamp = start_ns + offset - offset % STAMP_RESOLUTION_NS;
        match groups.last_mut() {
            Some((last, n)) if *last == stamp => *n += 1,
            _ => groups.push((stamp, 1)),
        }
    }
    groups
}

/// Latency percentiles (ms) of weighted (latency µs, count) entries.
fn percentiles(mut entries: Vec<(u64, u64)>, wanted: &[f64]) -> Vec<f64> {
    entries.sort_unstable();
    let total: u64 = entries.iter().map(|e| e.1).sum();
    wanted
        .iter()
        .map(|p| {
            let rank = ((total as f64) * p / 100.0).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (latency, count) in &entries {
                seen += count;
                if seen >= rank {
                    return *latency as f64 / 1000.0;
                }
            }
            entries.last().map(|e| e.0 as f64 / 1000.0).unwrap_or(0.0)
        })
        .collect()
}

fn json_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c {
            '"' => "\\\"".chars().collect::<Vec<_>>(),
            '\\' => "\\\\".chars().collect(),
            c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32).chars().collect(),
            c => vec![c],
        })
        .collect()
}

fn main() {
    let args = parse_args();
    if args.consume {
        return consume::run(args);
    }
    // At a fixed rate a batch holds what falls due within the linger time (at least one).
    let batch = if args.rate > 0.0 {
        ((args.rate * args.linger_ms / 1000.0) as usize).clamp(1, args.batch)
    } else {
        args.batch
    };
    let mut publishers = Vec::new();
    for w in 0..args.in_flight {
        match connect(&args, w) {
            Ok(p) => publishers.push(p),
            Err(error) => {
                println!("{{\"error\": \"connect: {}\"}}", json_escape(&error));
                std::process::exit(1);
            }
        }
    }
    let (now, now_ns) = (Instant::now(), monotonic_ns());
    let start_ns = if args.start_ns > 0 {
        args.start_ns
    } else {
        now_ns + 100_000_000
    };
    let start = if start_ns >= now_ns {
        now + Duration::from_nanos(start_ns - now_ns)
    } else {
        now.checked_sub(Duration::from_nanos(now_ns - start_ns))
            .unwrap_or(now)
    };
    let shared = Arc::new(Shared {
        args: args.clone(),
        start,
        start_ns,
        next_batch: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        batch,
    });
    let ready = Arc::new(Barrier::new(args.in_flight));
    let handles: Vec<_> = publishers
        .into_iter()
        .map(|p| {
            let (s, r) = (shared.clone(), ready.clone());
            std::thread::spawn(move || worker(s, p, r))
        })
        .collect();
    let results: Vec<WorkerResult> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let acks: Vec<Ack> = results
        .iter()
        .flat_map(|r| r.acks.iter().copied())
        .collect();
    let errors: u64 = results.iter().map(|r| r.errors).sum();
    let first_error = results
        .iter()
        .map(|r| r.first_error.clone())
        .find(|e| !e.is_empty());

    let window_start = (args.warmup * 1e6) as u64;
    let last_ack = acks.iter().map(|a| a.acked_us).max().unwrap_or(0);
    // A run cut short by --max-messages measures up to its last acknowledgement.
    let window_end = ((args.warmup + args.seconds) * 1e6) as u64;
    let window_end = if args.max_messages > 0 {
        window_end.min(last_ack.max(window_start + 1))
    } else {
        window_end
    };
    let in_window = |t: u64| t >= window_start && t < window_end;
    let acked: u64 = acks.iter().map(|a| a.count as u64).sum();
    let acked_in_window: u64 = acks
        .iter()
        .filter(|a| in_window(a.acked_us))
        .map(|a| a.count as u64)
        .sum();
    let latencies: Vec<(u64, u64)> = acks
        .iter()
        .filter(|a| in_window(a.intended_us))
        .map(|a| (a.acked_us - a.intended_us, a.count as u64))
        .collect();
    let window_s = (window_end - window_start) as f64 / 1e6;
    let mut out = String::new();
    out.push_str(&format!(
        "{{\"system\": \"{}\", \"message_size\": {}, \"batch\": {}, \"in_flight\": {}, \
         \"target_rate\": {}, \"duration_s\": {:.3}, \"acked\": {}, \"acked_in_window\": {}, \
         \"publish_msgs_per_s\": {:.1}, \"errors\": {}, \"first_error\": \"{}\"",
        args.system,
        args.message_size,
        batch,
        args.in_flight,
        args.rate,
        window_s,
        acked,
        acked_in_window,
        acked_in_window as f64 / window_s,
        errors,
        json_escape(first_error.as_deref().unwrap_or("")),
    ));
    if !latencies.is_empty() {
        let total: u64 = latencies.iter().map(|e| e.1).sum();
        let mean = latencies.iter().map(|e| e.0 * e.1).sum::<u64>() as f64 / total as f64 / 1000.0;
        let p = percentiles(latencies, &[50.0, 99.0, 99.9, 100.0]);
        out.push_str(&format!(
            ", \"publish_latency_ms\": {{\"p50\": {}, \"p99\": {}, \"p99.9\": {}, \"max\": {}, \
             \"mean\": {:.3}, \"count\": {}}}",
            p[0], p[1], p[2], p[3], mean, total
        ));
    } else {
        out.push_str(", \"publish_latency_ms\": null");
    }
    // Per second of acknowledgement time since the start: messages and p50/p99.
    let seconds = (last_ack / 1_000_000 + 1) as usize;
    let mut per_second: Vec<Vec<(u64, u64)>> =
        vec![Vec::new(); if acks.is_empty() { 0 } else { seconds }];
    for a in &acks {
        per_second[(a.acked_us / 1_000_000) as usize]
            .push((a.acked_us - a.intended_us, a.count as u64));
    }
    let points: Vec<String> = per_second
        .into_iter()
        .enumerate()
        .map(|(t, entries)| {
            let msgs: u64 = entries.iter().map(|e| e.1).sum();
            if entries.is_empty() {
                return format!("{{\"t\": {t}, \"msgs_per_s\": 0}}");
            }
            let p = percentiles(entries, &[50.0, 99.0]);
            format!(
                "{{\"t\": {t}, \"msgs_per_s\": {msgs}, \"p50_ms\": {}, \"p99_ms\": {}}}",
                p[0], p[1]
            )
        })
        .collect();
    out.push_str(&format!(", \"timeline\": [{}]}}", points.join(", ")));
    println!("{out}");
}
