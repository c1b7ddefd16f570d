//! `tally bench reduce`: how fast the reduction kernels move bytes, held
//! against `memcpy` on the same buffers in the same run.
//!
//! For n inputs of B bytes reduced into one output, a call moves (n+1)·B
//! bytes; a `memcpy` of B bytes moves 2·B. The roofline fraction is the
//! ratio of the two rates, so 1.0 means the kernel streams memory as fast as
//! the C library's copy does (see `measuring.md`). Buffers come from a slab,
//! as the server's do (hugepages when there are any).
//!
//! `--staged G` times the kernels' staged form instead, as a staged job's
//! lcore runs it: the n inputs folded G at a time into an accumulator
//! (`Kernels::fold`; f32 partials for 16-bit floats), then
//! `Kernels::finish_fold`. GB/s still counts (n+1)·B per call, so the two
//! forms compare directly.
use clap::Args;
use serde::Serialize;
use std::hint::black_box;
use std::time::Instant;
use tally_engine::dataplane::slab::{Slab, SlabConfig};
use tally_engine::host::units::{format_size, parse_size};
use tally_engine::reduce::{available_isas, DataType, Isa, Kernels, ReduceOp, MAX_INPUTS};

#[derive(Args, Debug, Clone)]
pub struct ReduceArgs {
    /// Element types, comma-separated (f32, f64, f16, bf16, i8, u8, i32, u32, i64, u64).
    #[arg(long, value_delimiter = ',', default_value = "f32,bf16,f16", value_parser = parse_dtype)]
    pub dtype: Vec<DataType>,
    /// Operations, comma-separated (sum, prod, max, min, avg).
    #[arg(long, value_delimiter = ',', default_value = "sum", value_parser = parse_op)]
    pub op: Vec<ReduceOp>,
    /// Numbers of inputs reduced into one output, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    pub inputs: Vec<usize>,
    /// Bytes per input, comma-separated (K/M/G suffixes, binary).
    #[arg(long, value_delimiter = ',', default_value = "256K,64M")]
    pub sizes: Vec<String>,
    /// Instruction sets, comma-separated (scalar, avx2, avx512, avx512bf16, neon). Default: all this CPU has.
    #[arg(long, value_delimiter = ',', value_parser = parse_isa)]
    pub isa: Vec<Isa>,
    /// Timed samples per case; the median is reported.
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Untimed samples per case before the timed ones.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Time the staged form: inputs folded this many at a time into an
    /// accumulator, then finished (0: the one-pass reduce).
    #[arg(long, default_value_t = 0)]
    pub staged: usize,
}

fn parse_dtype(s: &str) -> Result<DataType, String> {
    DataType::parse(s).ok_or_else(|| format!("unknown data type {s:?} (f32, f64, f16, bf16, i8, u8, i32, u32, i64, u64)"))
}

fn parse_op(s: &str) -> Result<ReduceOp, String> {
    ReduceOp::parse(s).ok_or_else(|| format!("unknown operation {s:?} (sum, prod, max, min, avg)"))
}

fn parse_isa(s: &str) -> Result<Isa, String> {
    Isa::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Isa::ALL.iter().map(|isa| isa.name()).collect();
        format!("unknown instruction set {s:?} ({})", names.join(", "))
    })
}

/// Each timed sample repeats the call until about this many bytes have
/// moved, so that in-cache sizes are not timed one microsecond at a time.
const SAMPLE_BYTES: usize = 32 << 20;

/// One measured case.
struct Row {
    dtype: DataType,
    op: ReduceOp,
    inputs: usize,
    bytes: usize,
    isa: Isa,
    seconds: f64,
    gbps: f64,
    roofline: f64,
}

/// What `--json` prints, fields in this order.
#[derive(Serialize)]
struct Report {
    memcpy: Vec<MemcpyJson>,
    results: Vec<ResultJson>,
}

#[derive(Serialize)]
struct MemcpyJson {
    bytes: usize,
    #[serde(rename = "GBps")]
    gbps: f64,
}

#[derive(Serialize)]
struct ResultJson {
    dtype: &'static str,
    op: &'static str,
    inputs: usize,
    bytes: usize,
    isa: &'static str,
    /// Inputs per fold of the staged form; 0 for the one pass.
    staged: usize,
    #[serde(rename = "GBps")]
    gbps: f64,
    roofline: f64,
}

pub fn run(args: &ReduceArgs) -> Result<(), String> {
    let sizes: Vec<usize> = args
        .sizes
        .iter()
        .map(|s| match parse_size(s) {
            Ok(0) => Err(format!("--sizes: {s:?} is empty")),
            Ok(v) => usize::try_from(v).map_err(|_| format!("--sizes: {s:?} is too large")),
            Err(e) => Err(format!("--sizes: {e}")),
        })
        .collect::<Result<_, _>>()?;
    if sizes.is_empty() || args.dtype.is_empty() || args.op.is_empty() || args.inputs.is_empty() {
        return Err("nothing to measure: --sizes, --dtype, --op and --inputs need at least one value".into());
    }
    if let Some(&n) = args.inputs.iter().find(|&&n| n == 0 || n > MAX_INPUTS) {
        return Err(format!("--inputs: {n} is not between 1 and {MAX_INPUTS}"));
    }
    if args.staged > MAX_INPUTS {
        return Err(format!("--staged: {} is more than {MAX_INPUTS} inputs a fold", args.staged));
    }
    let isas = if args.isa.is_empty() { available_isas() } else { args.isa.clone() };
    let kernels: Vec<Kernels> =
        isas.iter().map(|&isa| Kernels::for_isa(isa).map_err(|e| format!("--isa: {e}"))).collect::<Result<_, _>>()?;
    let reps = args.reps.max(1);
    let max_inputs = *args.inputs.iter().max().unwrap();

    if !args.json {
        let names: Vec<&str> = isas.iter().map(|isa| isa.name()).collect();
        let shown: Vec<String> = sizes.iter().map(|&s| format_size(s as u64)).collect();
        println!(
            "# tally bench reduce: bytes per input {}; instruction sets {}; one core, page-aligned slab buffers",
            shown.join(", "),
            names.join(", ")
        );
        println!(
            "# {reps} samples after {} warm-up, each timing back-to-back calls until {} has moved; statistic: median time per call",
            args.warmup,
            format_size(SAMPLE_BYTES as u64)
        );
        if args.staged > 0 {
            println!("# staged form: inputs folded {} at a time into an accumulator, then finished", args.staged);
        }
        println!(
            "# GB/s = (n+1)*B/t, decimal; roofline = ((n+1)*B/t) / (2*B/t_memcpy), t_memcpy the median memcpy of B bytes \
             on the same buffers, timed alternately with the case's own samples"
        );
    }

    let mut memcpy = Vec::new();
    let mut rows = Vec::new();
    for &size in &sizes {
        let mut slab = Slab::new(&SlabConfig { page_aligned_slots: true, ..SlabConfig::new("bench reduce", size, max_inputs + 1) })
            .map_err(|e| format!("buffers for {}: {e}", format_size(size as u64)))?;
        let backing = slab.backing();
        let slot = slab.slot_size();
        let mut slots: Vec<&mut [u8]> = slab.as_mut_slice().chunks_exact_mut(slot).map(|s| &mut s[..size]).collect();
        let (out, inputs) = slots.split_first_mut().unwrap();
        // The staged form's accumulator: f32 partials for 16-bit floats.
        let mut acc = vec![0u8; if args.staged > 0 { 2 * size } else { 0 }];
        if !args.json {
            println!("# {} per input ({backing})", format_size(size as u64));
            println!(
                "{:>5} {:>5} {:>4} {:>9} {:>10} {:>11} {:>9} {:>12} {:>9}",
                "dtype", "op", "n", "size", "isa", "time(us)", "GB/s", "memcpy GB/s", "roofline"
            );
        }

        let mut memcpy_samples = Vec::new();
        for &dtype in &args.dtype {
            let bytes = size - size % dtype.size();
            for (k, input) in inputs.iter_mut().enumerate() {
                fill(dtype, k as u64, &mut input[..bytes]);
            }
            for &op in &args.op {
                for &n in &args.inputs {
                    let views: Vec<&[u8]> = inputs[..n].iter().map(|s| &s[..bytes]).collect();
                    let addrs: Vec<*const u8> = views.iter().map(|v| v.as_ptr()).collect();
                    let moved = (n + 1) * bytes;
                    for k in &kernels {
                        let out = &mut out[..bytes];
                        let source = &*inputs[0];
                        let [reduce, copy] = time_paired(reps, args.warmup, [repeats(moved), repeats(2 * bytes)], |which| {
                            if which == 0 && args.staged > 0 {
                                staged(k, dtype, op, &mut acc, black_box(&addrs), bytes / dtype.size(), args.staged);
                            } else if which == 0 {
                                k.reduce(dtype, op, out, black_box(&views)).expect("checked arguments");
                            } else {
                                out.copy_from_slice(black_box(&source[..bytes]));
                            }
                            black_box(&mut *out);
                        });
                        let gbps = moved as f64 / median(&reduce) / 1e9;
                        let memcpy_gbps = 2.0 * bytes as f64 / median(&copy) / 1e9;
                        memcpy_samples.extend(copy.iter().map(|t| t * size as f64 / bytes as f64));
                        let row =
                            Row { dtype, op, inputs: n, bytes, isa: k.isa(), seconds: median(&reduce), gbps, roofline: gbps / memcpy_gbps };
                        if !args.json {
                            println!(
                                "{:>5} {:>5} {:>4} {:>9} {:>10} {:>11.2} {:>9.2} {:>12.2} {:>9.3}",
                                row.dtype.name(),
                                row.op.name(),
                                row.inputs,
                                format_size(row.bytes as u64),
                                row.isa.name(),
                                row.seconds * 1e6,
                                row.gbps,
                                memcpy_gbps,
                                row.roofline
                            );
                        }
                        rows.push(row);
                    }
                }
            }
        }
        let memcpy_gbps = 2.0 * size as f64 / median(&memcpy_samples) / 1e9;
        memcpy.push(MemcpyJson { bytes: size, gbps: memcpy_gbps });
        if !args.json {
            println!(
                "# {}: memcpy {:.1} GB/s copied, {:.1} GB/s moved (read + write), median of all {} samples",
                format_size(size as u64),
                memcpy_gbps / 2.0,
                memcpy_gbps,
                memcpy_samples.len()
            );
        }
    }

    if args.json {
        let results = rows
            .iter()
            .map(|r| ResultJson {
                dtype: r.dtype.name(),
                op: r.op.name(),
                inputs: r.inputs,
                bytes: r.bytes,
                isa: r.isa.name(),
                staged: args.staged,
                gbps: r.gbps,
                roofline: r.roofline,
            })
            .collect();
        let report = Report { memcpy, results };
        println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
    }
    Ok(())
}

/// Calls per timed sample for a call that moves `bytes`.
/// The staged form over `inputs`, `group` at a time, into `acc`.
fn staged(k: &Kernels, dtype: DataType, op: ReduceOp, acc: &mut [u8], inputs: &[*const u8], elems: usize, group: usize) {
    assert!(acc.len() >= elems * dtype.accumulator_size());
    let p = acc.as_mut_ptr();
    for (g, ins) in inputs.chunks(group).enumerate() {
        // SAFETY: every input is a live slab slot of `elems` elements; the
        // accumulator is a separate buffer with room for `elems` of its
        // elements (asserted above).
        unsafe { k.fold(dtype, op, p, g > 0, ins, elems) }.expect("checked arguments");
    }
    // SAFETY: as above.
    unsafe { k.finish_fold(dtype, op, p, elems, inputs.len()) }.expect("checked arguments");
    black_box(acc);
}

fn repeats(bytes: usize) -> usize {
    SAMPLE_BYTES.div_ceil(bytes.max(1))
}

/// Times two things sample by sample, alternating, so that both see the
/// same machine (on a shared host, memory bandwidth drifts within seconds):
/// `call(0)` and `call(1)`, `inner[i]` calls per sample. Returns the seconds
/// per call of every sample of each.
fn time_paired(reps: usize, warmup: usize, inner: [usize; 2], mut call: impl FnMut(usize)) -> [Vec<f64>; 2] {
    let mut sample = |which: usize| {
        let start = Instant::now();
        for _ in 0..inner[which] {
            call(which);
        }
        start.elapsed().as_secs_f64() / inner[which] as f64
    };
    for _ in 0..warmup {
        sample(0);
        sample(1);
    }
    let mut samples = [Vec::with_capacity(reps), Vec::with_capacity(reps)];
    for _ in 0..reps {
        for (which, times) in samples.iter_mut().enumerate() {
            times.push(sample(which));
        }
    }
    samples
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// Fills `buf` with values such as gradients hold: finite, of mixed sign,
/// within a few powers of two of 1 (no subnormals, which some CPUs slow
/// down on, and which real gradients rarely are); integers get any bits.
fn fill(dtype: DataType, stream: u64, buf: &mut [u8]) {
    let mut rng = XorShift(stream.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    match dtype {
        DataType::Float32 => buf.chunks_exact_mut(4).for_each(|c| c.copy_from_slice(&rng.value().to_ne_bytes())),
        DataType::Float64 => buf.chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&f64::from(rng.value()).to_ne_bytes())),
        // Truncating the f32 keeps the values normal in both 16-bit formats.
        DataType::Bfloat16 => {
            buf.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&((rng.value().to_bits() >> 16) as u16).to_ne_bytes()))
        }
        DataType::Float16 => buf.chunks_exact_mut(2).for_each(|c| {
            let bits = rng.value().to_bits();
            let (sign, exponent, mantissa) = (bits >> 31, (bits >> 23) & 0xff, (bits >> 13) & 0x3ff);
            let half = (sign << 15) | ((exponent - 127 + 15) << 10) | mantissa;
            c.copy_from_slice(&(half as u16).to_ne_bytes())
        }),
        _ => buf.chunks_mut(8).for_each(|c| {
            let r = rng.next().to_ne_bytes();
            c.copy_from_slice(&r[..c.len()])
        }),
    }
}

/// xorshift64*: fast enough to fill hundreds of MiB in a blink.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A float of either sign with magnitude in [2^-4, 2^4).
    fn value(&mut self) -> f32 {
        let r = self.next();
        let mantissa = 1.0 + (r >> 40) as f32 / (1u64 << 24) as f32;
        let magnitude = mantissa * f32::from_bits((127 - 4 + (r & 7) as u32) << 23);
        if r & 8 == 0 {
            magnitude
        } else {
            -magnitude
        }
    }
}
