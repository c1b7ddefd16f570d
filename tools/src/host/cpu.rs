//! The host's CPU as the host commands name it, read from /proc/cpuinfo:
//! its model and the SIMD the reduction kernels could use.
//!
//! On Arm, /proc/cpuinfo has no model name, only the core's `CPU
//! implementer` and `CPU part` numbers. On AWS those name the Graviton
//! generation, which is what an operator sizes a server by: Neoverse N1 is
//! Graviton2 (c6gn), V1 Graviton3 and 3E (c7g, c7gn), V2 Graviton4 (c8g,
//! c8gn). The `Features` line says which SIMD the core has: NEON (`asimd`),
//! its FP16 arithmetic (`asimdhp`), BF16 (`bf16`), SVE and SVE2. The kernels
//! are NEON (engine/src/reduce/neon.rs): SVE is named, not used.
//!
//! [`parse`] is a pure function of the file's text, so that the tests
//! describe a c7gn or a c8gn from here.
use serde::Serialize;

/// What the host commands say about the CPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CpuFacts {
    /// `Neoverse V1`, or x86's `model name`; `None` when the file names no model.
    pub model: Option<String>,
    /// Where AWS runs that core (`Graviton3/3E: c7g, c7gn`), Arm only.
    pub instances: Option<&'static str>,
    /// SIMD extensions the reduction kernels care about, in a fixed order.
    pub simd: Vec<&'static str>,
    /// `processor` entries: the CPUs the kernel lists.
    pub cpus: usize,
}

/// Arm Ltd's implementer code, and its Neoverse parts with the AWS
/// instances that run them.
const ARM_LTD: &str = "0x41";
const NEOVERSE: &[(&str, &str, Option<&str>)] = &[
    ("0xd0c", "Neoverse N1", Some("Graviton2: c6g, c6gn")),
    ("0xd40", "Neoverse V1", Some("Graviton3/3E: c7g, c7gn")),
    ("0xd49", "Neoverse N2", None),
    ("0xd4f", "Neoverse V2", Some("Graviton4: c8g, c8gn")),
    ("0xd8e", "Neoverse N3", None),
    ("0xd84", "Neoverse V3", None),
];

/// `Features` (Arm) or `flags` (x86) words and the names given to them.
const ARM_SIMD: &[(&str, &str)] = &[("asimd", "NEON"), ("asimdhp", "FP16"), ("bf16", "BF16"), ("sve", "SVE"), ("sve2", "SVE2")];
const X86_SIMD: &[(&str, &str)] =
    &[("avx2", "AVX2"), ("f16c", "F16C"), ("avx512f", "AVX-512F"), ("avx512bw", "AVX-512BW"), ("avx512_bf16", "AVX512_BF16")];

/// Facts from /proc/cpuinfo's text (the first processor's entry names the
/// model and features: AWS instances have one kind of core).
pub fn parse(text: &str) -> CpuFacts {
    let field = |key: &str| first_field(text, key);
    let cpus = text.lines().filter(|l| l.split_once(':').is_some_and(|(k, _)| k.trim() == "processor")).count();
    let (words, table) = match (field("Features"), field("flags")) {
        (Some(f), _) => (f, ARM_SIMD),
        (None, Some(f)) => (f, X86_SIMD),
        (None, None) => ("", ARM_SIMD),
    };
    let have: Vec<&str> = words.split_whitespace().collect();
    let simd = table.iter().filter(|(w, _)| have.contains(w)).map(|&(_, name)| name).collect();
    let arm = field("CPU implementer").zip(field("CPU part")).map(|(imp, part)| {
        let part = part.to_ascii_lowercase();
        match NEOVERSE.iter().find(|(p, _, _)| imp.eq_ignore_ascii_case(ARM_LTD) && *p == part) {
            Some(&(_, name, instances)) => (name.to_string(), instances),
            None => (format!("Arm core (implementer {imp}, part {part})"), None),
        }
    });
    let (model, instances) = match arm {
        Some((name, instances)) => (Some(name), instances),
        None => (field("model name").map(str::to_string), None),
    };
    CpuFacts { model, instances, simd, cpus }
}

/// The first `key : value` line's value.
fn first_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// This host's facts (empty when /proc/cpuinfo is unreadable).
pub fn read() -> CpuFacts {
    std::fs::read_to_string("/proc/cpuinfo").map(|t| parse(&t)).unwrap_or_default()
}

impl CpuFacts {
    /// One line: `Neoverse V1 (Graviton3/3E: c7g, c7gn), 64 CPUs; SIMD: NEON, FP16, BF16, SVE`.
    pub fn describe(&self) -> String {
        let model = self.model.as_deref().unwrap_or("unknown CPU");
        let instances = self.instances.map(|i| format!(" ({i})")).unwrap_or_default();
        let simd = if self.simd.is_empty() { "none found".to_string() } else { self.simd.join(", ") };
        format!("{model}{instances}, {} CPUs; SIMD: {simd}", self.cpus)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A processor entry as an arm64 kernel prints it.
    fn arm(part: &str, features: &str, n: usize) -> String {
        (0..n)
            .map(|i| {
                format!(
                    "processor\t: {i}\nBogoMIPS\t: 2100.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\n\
                     CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: {part}\nCPU revision\t: 1\n\n"
                )
            })
            .collect()
    }

    #[test]
    fn graviton3_is_neoverse_v1_with_sve() {
        let f = parse(&arm("0xd40", "fp asimd evtstrm aes atomics fphp asimdhp cpuid asimddp sve asimdfhm svebf16 i8mm bf16 rng", 64));
        assert_eq!(f.model.as_deref(), Some("Neoverse V1"));
        assert_eq!(f.instances, Some("Graviton3/3E: c7g, c7gn"));
        assert_eq!(f.simd, ["NEON", "FP16", "BF16", "SVE"]);
        assert_eq!(f.cpus, 64);
        assert_eq!(f.describe(), "Neoverse V1 (Graviton3/3E: c7g, c7gn), 64 CPUs; SIMD: NEON, FP16, BF16, SVE");
    }

    #[test]
    fn graviton4_is_neoverse_v2_with_sve2() {
        let f = parse(&arm("0xd4f", "fp asimd asimdhp sve sve2 bf16 svebf16", 2));
        assert_eq!(f.model.as_deref(), Some("Neoverse V2"));
        assert_eq!(f.instances, Some("Graviton4: c8g, c8gn"));
        assert_eq!(f.simd, ["NEON", "FP16", "BF16", "SVE", "SVE2"]);
    }

    #[test]
    fn graviton2_is_neoverse_n1_without_sve() {
        let f = parse(&arm("0xD0C", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp", 1));
        assert_eq!(f.model.as_deref(), Some("Neoverse N1"));
        assert_eq!(f.simd, ["NEON", "FP16"]);
    }

    #[test]
    fn unknown_arm_core_is_named_by_its_numbers() {
        let f = parse(&arm("0xd03", "fp asimd", 4));
        assert_eq!(f.model.as_deref(), Some("Arm core (implementer 0x41, part 0xd03)"));
        assert_eq!(f.instances, None);
    }

    #[test]
    fn x86_model_name_and_avx() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\n\
                    flags\t\t: fpu sse2 avx2 f16c avx512f avx512bw avx512_bf16\n\nprocessor\t: 1\n";
        let f = parse(text);
        assert_eq!(f.model.as_deref(), Some("Intel(R) Xeon(R) Platinum 8488C"));
        assert_eq!(f.simd, ["AVX2", "F16C", "AVX-512F", "AVX-512BW", "AVX512_BF16"]);
        assert_eq!(f.cpus, 2);
    }

    #[test]
    fn empty_text_is_unknown() {
        assert_eq!(parse("").describe(), "unknown CPU, 0 CPUs; SIMD: none found");
    }
}
