//! The deployment files, config/k8s/ and config/slurm/, checked the way an
//! operator's cluster would take them, and their start-up commands run.
//!
//! - Schemas: `kubernetes-validate --strict` (PyPI; `make deps` installs it in
//!   target/py-tools) checks every Kubernetes object against the API's own
//!   JSON schemas, unknown fields included, for the oldest and the newest
//!   Kubernetes release it bundles that we claim. The PodMonitor is a CRD
//!   those schemas do not have: its fields are checked here.
//! - What a schema cannot say, read from the YAML (yaml-rust2) and the
//!   server's own configuration parser: the server pod is Guaranteed with
//!   whole CPUs; its CPU request fits the node's allocatable minus the
//!   daemonset budget the header states; its hugepages cover lcores x slab
//!   plus EFA's buffers; probes and scrape settings point at the configured
//!   metrics port; the kubelet settings the header names exist; the `TALLY_*`
//!   variables set are ones the code reads.
//! - The container command and the Slurm server step are run, with this
//!   build's `tally` and a configuration of the manifest's made to run here
//!   (tcp, small slabs), under `taskset` on two of this host's CPUs: each
//!   must start a real server whose one lcore is the second CPU (the first
//!   is the control plane's), and stop before any server starts when there
//!   is no CPU left for lcores, the CPUs are not the container's own, or
//!   `tally doctor` fails a check.
//! - The Slurm scripts pass `bash -n` and shellcheck (Debian package), and so
//!   does the container command.
//!
//! A missing kubernetes-validate or shellcheck fails its test, saying to run
//! `make deps`: a check that silently did not run would pass for one that did.
//!
//! A Rust test rather than a shell script: the embedded configuration goes
//! through the server's own parser (`ServerFile`), sizes and CPU lists through
//! the engine's, and the commands run this build's binary, so the checks
//! follow what the server does instead of restating it.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use tally_e2e::show_output as show;
use tally_engine::host::config::{ServerConfig, ServerFile};
use tally_engine::host::cpuset::CoreList;
use tally_engine::host::units::parse_size;
use yaml_rust2::{Yaml, YamlLoader};

const SERVER_YAML: &str = "config/k8s/tally-server.yaml";
const WORKER_YAML: &str = "config/k8s/worker.yaml";
const WORKER_TCP_YAML: &str = "config/k8s/worker-tcp.yaml";
const SERVER_TCP_YAML: &str = "config/k8s/tally-server-tcp.yaml";
const PODMONITOR_YAML: &str = "config/k8s/podmonitor.yaml";
const SBATCH: &str = "config/slurm/tally-train.sbatch";
const SERVER_STEP: &str = "config/slurm/tally-server-step.sh";

/// The node the DaemonSet selects: c7gn.16xlarge, 64 vCPUs and 128 GiB.
const NODE_TYPE: &str = "c7gn.16xlarge";
const NODE_CPUS: u64 = 64;
const NODE_MEMORY: u64 = 128 << 30;
/// What the node keeps for its kernel, kubelet and eviction threshold: the
/// pod's memory and hugepages must leave this much.
const NODE_SYSTEM_MEMORY: u64 = 16 << 30;
/// The CPU the other pods of every node (daemonsets) may request, in
/// millicores, as tally-server.yaml's header states it.
const DAEMONSET_CPU_BUDGET_M: u64 = 1000;
/// Hugepages beyond the slabs for each lcore's EFA endpoint (its registered
/// packet pools), at the least.
const EFA_HUGEPAGES_PER_LCORE: u64 = 64 << 20;
/// Kubelet flags and configuration-file fields for CPU pinning (kubelet
/// --help and KubeletConfiguration, v1.29 to v1.33); a name the header uses
/// must be one of these.
const KUBELET_FLAGS: &[&str] = &[
    "--cpu-manager-policy",
    "--cpu-manager-policy-options",
    "--reserved-cpus",
    "--kube-reserved",
    "--system-reserved",
    "--topology-manager-policy",
];
const KUBELET_FIELDS: &[&str] = &["cpuManagerPolicy", "cpuManagerPolicyOptions", "reservedSystemCPUs", "kubeReserved", "systemReserved"];
/// The Kubernetes releases the schemas are checked against: the oldest we
/// claim (every field used is GA there) and the newest the tool bundles.
const K8S_VERSIONS: &[&str] = &["1.29", "1.37"];
/// Where scripts/build/deps-py.sh installs the Python tools.
const PY_TOOLS: &str = "target/py-tools/bin";
/// The longest a command under test may take to start a server or stop: a
/// guard against hanging the suite, not a timing assertion.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn yaml_docs(rel: &str) -> Vec<Yaml> {
    let docs = YamlLoader::load_from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn kind<'a>(docs: &'a [Yaml], k: &str) -> &'a Yaml {
    docs.iter().find(|d| d["kind"].as_str() == Some(k)).unwrap_or_else(|| panic!("no {k}"))
}

fn text(y: &Yaml) -> String {
    match y {
        Yaml::String(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// A Kubernetes quantity of bytes ("34Gi", "16Gi") in bytes.
fn bytes(q: &Yaml) -> u64 {
    let q = text(q);
    parse_size(q.trim_end_matches('i')).unwrap_or_else(|e| panic!("quantity {q}: {e}"))
}

/// The comment lines that open a file, without their `#`.
fn header(file: &str) -> String {
    file.lines().take_while(|l| l.starts_with('#')).map(|l| l.trim_start_matches('#').trim()).collect::<Vec<_>>().join("\n")
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or_else(|| panic!("no port in {addr}"))
}

/// The DaemonSet's pod spec, its server container and the ConfigMap's
/// server configuration (as the server resolves it).
struct ServerManifest {
    docs: Vec<Yaml>,
    header: String,
    toml: String,
    config: ServerConfig,
}

impl ServerManifest {
    fn load() -> ServerManifest {
        let file = read(SERVER_YAML);
        let docs = yaml_docs(SERVER_YAML);
        let toml = text(&kind(&docs, "ConfigMap")["data"]["server.toml"]);
        let config = ServerFile::parse(&toml).and_then(|f| f.resolve()).unwrap_or_else(|e| panic!("{SERVER_YAML} server.toml: {e}"));
        ServerManifest { header: header(&file), docs, toml, config }
    }
    fn pod(&self) -> &Yaml {
        &kind(&self.docs, "DaemonSet")["spec"]["template"]
    }
    fn container(&self) -> &Yaml {
        &self.pod()["spec"]["containers"][0]
    }
    /// The container's port of this name.
    fn port(&self, name: &str) -> u16 {
        let ports = self.container()["ports"].as_vec().unwrap();
        let p = ports.iter().find(|p| p["name"].as_str() == Some(name)).unwrap_or_else(|| panic!("no port {name}"));
        p["containerPort"].as_i64().unwrap() as u16
    }
    fn script(&self) -> String {
        let c = self.container();
        assert_eq!(c["command"].as_vec().unwrap().iter().map(text).collect::<Vec<_>>(), ["/bin/bash", "-c"]);
        text(&c["args"][0])
    }
}

// ---- schemas and shell linting ----------------------------------------------

fn tool(name: &str) -> PathBuf {
    let venv = repo().join(PY_TOOLS).join(name);
    if venv.is_file() {
        return venv;
    }
    let on_path = std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|f| f.is_file()));
    on_path.unwrap_or_else(|| panic!("{name} not found ({PY_TOOLS} or PATH): run `make deps` (scripts/build/deps.sh, deps-py.sh)"))
}

#[test]
fn kubernetes_objects_match_the_api_schemas() {
    let validate = tool("kubernetes-validate");
    for rel in [SERVER_YAML, SERVER_TCP_YAML, WORKER_YAML, WORKER_TCP_YAML] {
        let objects = yaml_docs(rel).len();
        for v in K8S_VERSIONS {
            let o = Command::new(&validate).args(["--strict", "-k", v]).arg(repo().join(rel)).output().unwrap();
            let report = show(&o);
            assert!(o.status.success(), "{rel} against Kubernetes {v}:\n{report}");
            // Every object was checked against a schema (an unknown kind is only a warning).
            let passed = String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.contains(" passed for resource ")).count();
            assert_eq!(passed, objects, "{rel} against Kubernetes {v}:\n{report}");
        }
    }
}

#[test]
fn scripts_pass_bash_n_and_shellcheck() {
    let shellcheck = tool("shellcheck");
    for rel in [SBATCH, SERVER_STEP] {
        let o = Command::new("bash").arg("-n").arg(repo().join(rel)).output().unwrap();
        assert!(o.status.success(), "bash -n {rel}:\n{}", show(&o));
        let o = Command::new(&shellcheck).arg(repo().join(rel)).output().unwrap();
        assert!(o.status.success(), "shellcheck {rel}:\n{}", show(&o));
    }
    // The container command, as the image's bash runs it.
    let script = ServerManifest::load().script();
    let mut c = Command::new(&shellcheck).args(["-s", "bash", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut c.stdin.take().unwrap(), script.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "shellcheck of {SERVER_YAML}'s container command:\n{}", show(&o));
}

// ---- the server DaemonSet -----------------------------------------------------

#[test]
fn server_header_names_real_kubelet_settings() {
    let m = ServerManifest::load();
    assert!(!m.header.contains("--reserved-system-cpus"), "no such kubelet flag");
    for line in m.header.lines().filter(|l| l.starts_with("kubelet ")) {
        for flag in line.split_whitespace().filter(|w| w.starts_with("--")) {
            let name = flag.split('=').next().unwrap();
            assert!(KUBELET_FLAGS.contains(&name), "{SERVER_YAML}: `{name}` is not a kubelet flag");
        }
    }
    for line in m.header.lines().filter(|l| l.contains(": ") && l.split(':').next().unwrap().chars().all(|c| c.is_ascii_alphabetic())) {
        let field = line.split(':').next().unwrap();
        if field.chars().next().unwrap().is_ascii_lowercase() && field.chars().any(|c| c.is_ascii_uppercase()) {
            assert!(KUBELET_FIELDS.contains(&field), "{SERVER_YAML}: `{field}` is not a kubelet configuration field");
        }
    }
    // The flag and the configuration field reserve the same CPUs.
    assert_eq!(reserved_cpus(&m.header, "--reserved-cpus="), reserved_cpus(&m.header, "reservedSystemCPUs: "));
    assert!(m.header.contains("--cpu-manager-policy=static") && m.header.contains("cpuManagerPolicy: static"));
}

/// The CPU list after `key` in the header.
fn reserved_cpus(header: &str, key: &str) -> CoreList {
    let at = header.find(key).unwrap_or_else(|| panic!("{SERVER_YAML}'s header does not name {key}")) + key.len();
    let word = header[at..].split_whitespace().next().unwrap().trim_matches('"');
    CoreList::parse(word).unwrap()
}

#[test]
fn server_pod_is_guaranteed_and_fits_the_node() {
    let m = ServerManifest::load();
    let pod = &m.pod()["spec"];
    assert_eq!(pod["nodeSelector"]["node.kubernetes.io/instance-type"].as_str(), Some(NODE_TYPE));
    assert_eq!(pod["hostNetwork"].as_bool(), Some(true));
    let req = &m.container()["resources"]["requests"];
    let lim = &m.container()["resources"]["limits"];
    // Guaranteed QoS with whole CPUs: what the static CPU manager pins.
    assert_eq!(req, lim, "requests must equal limits");
    let cpus: u64 = text(&req["cpu"]).parse().expect("a whole number of CPUs");
    for r in ["memory", "hugepages-2Mi", "vpc.amazonaws.com/efa"] {
        assert!(!req[r].is_badvalue(), "no {r} request");
    }
    // allocatable = the node's CPUs less the kubelet's reserved ones; the pod
    // leaves the stated budget for the daemonsets.
    let reserved = reserved_cpus(&m.header, "--reserved-cpus=").len() as u64;
    let allocatable_m = (NODE_CPUS - reserved) * 1000;
    assert!(
        cpus * 1000 + DAEMONSET_CPU_BUDGET_M <= allocatable_m,
        "cpu {cpus} + {DAEMONSET_CPU_BUDGET_M}m of daemonsets > {allocatable_m}m allocatable"
    );
    assert!(m.header.contains(&format!("({DAEMONSET_CPU_BUDGET_M}m)")), "the header states the daemonset budget");
    assert!(m.header.contains(&format!("= {}", NODE_CPUS - reserved)) && m.header.contains(&format!("= {cpus}")), "the header's sum");
    // Memory: the pod's, its hugepages and the system's fit the node, and the
    // node reserves at boot the hugepages the pod asks for.
    let huge = bytes(&req["hugepages-2Mi"]);
    assert!(bytes(&req["memory"]) + huge + NODE_SYSTEM_MEMORY <= NODE_MEMORY);
    let pages = huge / (2 << 20);
    assert!(m.header.contains(&format!("{pages} 2 MiB hugepages reserved at boot")), "the header names the pages to reserve: {pages}");
    assert!(m.header.contains(&format!("hugepages={pages}")));
}

#[test]
fn server_hugepages_cover_slabs_and_efa_buffers() {
    let m = ServerManifest::load();
    let req = &m.container()["resources"]["requests"];
    let cpus: u64 = text(&req["cpu"]).parse().unwrap();
    // The container keeps one of its CPUs for the control plane (run in
    // server_container_command_* below): the rest are lcores.
    let lcores = cpus - 1;
    let slab = m.config.slab_size;
    assert_eq!(m.config.hugepages, "require");
    assert!(slab < 768 << 20, "2 MiB pages: a slab of 3/4 GiB or more would take 1 GiB pages");
    let huge = bytes(&req["hugepages-2Mi"]);
    let slabs = lcores * slab;
    assert!(
        huge >= slabs + lcores * EFA_HUGEPAGES_PER_LCORE,
        "hugepages {huge} < {lcores} lcores x ({slab} slab + {EFA_HUGEPAGES_PER_LCORE} for EFA)"
    );
    // The header's arithmetic is this arithmetic.
    let line = format!("{lcores} lcores x {} MiB slabs = {} GiB", slab >> 20, slabs >> 30);
    assert!(m.header.contains(&line), "header lacks `{line}`");
    assert!(m.header.contains(&format!("{} GiB for libfabric's", (huge - slabs) >> 30)));
}

#[test]
fn server_probes_and_scrape_settings_use_the_metrics_port() {
    let m = ServerManifest::load();
    let metrics = m.config.metrics.clone().expect("the ConfigMap's server serves metrics");
    let (host, _) = metrics.rsplit_once(':').unwrap();
    // The kubelet probes, and Prometheus scrapes, the node's address.
    assert!(["0.0.0.0", "[::]"].contains(&host), "metrics on {metrics}: not reachable at the node's address");
    let port = port_of(&metrics);
    assert_eq!(m.port("metrics"), port);
    assert_eq!(m.port("control"), port_of(&m.config.listen));
    let c = m.container();
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        let p = match &get["port"] {
            Yaml::String(name) => m.port(name),
            Yaml::Integer(n) => *n as u16,
            other => panic!("{probe} port {other:?}"),
        };
        assert_eq!(p, port, "{probe} port");
    }
    let startup = &c["startupProbe"];
    assert!(
        startup["periodSeconds"].as_i64().unwrap() * startup["failureThreshold"].as_i64().unwrap() >= 60,
        "startup allows a minute at least"
    );
    // SIGTERM drains: the pod is given longer than the drain.
    let grace = m.pod()["spec"]["terminationGracePeriodSeconds"].as_i64().unwrap() as u64;
    assert!(grace > m.config.drain_timeout_s, "grace {grace} s <= drain_timeout_s {}", m.config.drain_timeout_s);

    // Annotations for Prometheus' pod discovery.
    let ann = &m.pod()["metadata"]["annotations"];
    assert_eq!(ann["prometheus.io/scrape"].as_str(), Some("true"));
    assert_eq!(ann["prometheus.io/port"].as_str(), Some(port.to_string().as_str()));
    assert_eq!(ann["prometheus.io/path"].as_str(), Some("/metrics"));

    // The PodMonitor selects these pods, on the same port and path.
    let docs = yaml_docs(PODMONITOR_YAML);
    let pm = kind(&docs, "PodMonitor");
    assert_eq!(pm["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
    let ds = kind(&m.docs, "DaemonSet");
    assert_eq!(pm["metadata"]["namespace"], ds["metadata"]["namespace"]);
    let labels = m.pod()["metadata"]["labels"].as_hash().unwrap();
    let selector = pm["spec"]["selector"]["matchLabels"].as_hash().unwrap();
    assert!(!selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v)), "the PodMonitor selects no server pod");
    let ep = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(m.port(ep["port"].as_str().unwrap()), port);
    assert_eq!(ep["path"].as_str(), Some("/metrics"));
}

/// `TALLY_*` names that code under engine/, ffi-plugin/ and tools/ reads (a
/// string literal outside the settings registry, which only lists them).
fn read_by_code(name: &str) -> bool {
    fn walk(dir: &Path, needle: &str) -> bool {
        std::fs::read_dir(dir).unwrap().flatten().any(|e| {
            let p = e.path();
            if p.is_dir() {
                walk(&p, needle)
            } else {
                p.extension().is_some_and(|x| x == "rs")
                    && p.file_name().is_some_and(|f| f != "settings.rs")
                    && std::fs::read_to_string(&p).unwrap_or_default().contains(needle)
            }
        })
    }
    ["engine/src", "ffi-plugin/src", "tools/src"].iter().any(|d| walk(&repo().join(d), &format!("\"{name}\"")))
}

#[test]
fn tally_variables_set_are_ones_the_code_reads() {
    let m = ServerManifest::load();
    let mut names = BTreeSet::new();
    for e in m.container()["env"].as_vec().unwrap() {
        names.insert(text(&e["name"]));
    }
    let worker = yaml_docs(WORKER_YAML);
    for (k, _) in kind(&worker, "ConfigMap")["data"].as_hash().unwrap() {
        names.insert(text(k));
    }
    for e in kind(&worker, "Job")["spec"]["template"]["spec"]["containers"][0]["env"].as_vec().unwrap() {
        names.insert(text(&e["name"]));
    }
    for (k, _) in kind(&yaml_docs(WORKER_TCP_YAML), "ConfigMap")["data"].as_hash().unwrap() {
        names.insert(text(k));
    }
    for line in read(SBATCH).lines().filter_map(|l| l.trim().strip_prefix("export ")) {
        names.extend(line.split_whitespace().map(|w| w.split('=').next().unwrap().to_string()));
    }
    let tally: Vec<_> = names.iter().filter(|n| n.starts_with("TALLY_")).collect();
    assert!(tally.len() >= 3, "{tally:?}");
    for n in tally {
        // The sbatch's own settings (TALLY_PORT, ...) are exported for its steps' shells.
        if ["TALLY_PORT", "TALLY_CONFIG", "TALLY_FABRIC"].contains(&n.as_str()) {
            continue;
        }
        assert!(read_by_code(n), "{n} is set by the manifests or the sbatch, but no code reads it");
    }
}

// ---- the worker Job -------------------------------------------------------------

#[test]
fn worker_job() {
    let docs = yaml_docs(WORKER_YAML);
    let env = &kind(&docs, "ConfigMap")["data"];
    assert_eq!(env["NCCL_NET_PLUGIN"].as_str(), Some("tally"));
    assert_eq!(env["NCCL_COLLNET_ENABLE"].as_str(), Some("1"));
    assert_eq!(env["FI_PROVIDER"].as_str(), Some("efa"));
    // The servers' port is the one the server manifest listens on.
    let listen = port_of(&ServerManifest::load().config.listen);
    let servers = text(&env["TALLY_SERVERS"]);
    assert!(servers.split(',').all(|s| port_of(s) == listen), "{servers} vs port {listen}");
    let job = kind(&docs, "Job");
    let c = &job["spec"]["template"]["spec"]["containers"][0];
    assert!(c["env"]
        .as_vec()
        .unwrap()
        .iter()
        .any(|e| e["name"].as_str() == Some("TALLY_TOKEN") && !e["valueFrom"]["secretKeyRef"]["key"].is_badvalue()));
    assert_eq!(c["envFrom"][0]["configMapRef"]["name"], kind(&docs, "ConfigMap")["metadata"]["name"]);
    // Extended resources: whole, and requests equal limits.
    for r in ["nvidia.com/gpu", "vpc.amazonaws.com/efa"] {
        let n = c["resources"]["limits"][r].as_i64().unwrap_or_else(|| panic!("{r}"));
        assert!(n > 0);
        assert_eq!(c["resources"]["requests"][r].as_i64(), Some(n), "{r}");
    }
    // The fork/hugepage settings are the ones efa-env decides for an EFA host
    // on a kernel with copy-on-fork.
    let o = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["efa-env", "print", "--role", "worker", "--format", "json", "--assume-efa"])
        .env_remove("FI_EFA_FORK_SAFE")
        .env_remove("FI_EFA_USE_HUGE_PAGE")
        .env_remove("FI_PROVIDER")
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", show(&o)));
    let decided = |n: &str| j["settings"].as_array().unwrap().iter().find(|s| s["name"] == n).map(|s| s["value"].clone());
    assert_eq!(decided("FI_EFA_USE_HUGE_PAGE"), Some(serde_json::json!(text(&env["FI_EFA_USE_HUGE_PAGE"]))));
    assert_eq!(decided("FI_PROVIDER"), Some(serde_json::json!("efa")));
    let k = &j["facts"]["kernel"];
    if k["major"].as_u64().unwrap() * 100 + k["minor"].as_u64().unwrap() >= 513 {
        assert_eq!(decided("FI_EFA_FORK_SAFE"), Some(serde_json::json!(text(&env["FI_EFA_FORK_SAFE"]))));
    }
}

// ---- the Slurm batch script --------------------------------------------------

#[test]
fn slurm_batch_script_runs_the_server_step() {
    let text = read(SBATCH);
    for needle in [
        "#!/bin/bash",
        "#SBATCH hetjob",
        "set -euo pipefail",
        "srun --het-group=0",
        "srun --het-group=1",
        "efa-env print --role worker",
        "export NCCL_NET_PLUGIN=tally",
        "export NCCL_COLLNET_ENABLE=1",
        "export TALLY_SERVERS",
        "export TALLY_TOKEN",
        "SLURM_JOB_NODELIST_HET_GROUP_0",
        // The step script, from the submit directory unless given.
        &format!("${{SLURM_SUBMIT_DIR:-.}}/{SERVER_STEP}"),
        "server_step=\"$(<\"$TALLY_SERVER_STEP\")\"",
    ] {
        assert!(text.contains(needle), "{needle} missing from {SBATCH}");
    }
    // The server step: one task per node, unbound (the step's whole CPU set
    // is the task's), failing the job when it fails, running the step's text.
    let srun: String = text.lines().skip_while(|l| !l.trim_start().starts_with("srun --het-group=0")).take(2).collect::<Vec<_>>().join(" ");
    for w in ["--ntasks-per-node=1", "--cpu-bind=none", "--kill-on-bad-exit=1", "bash -c \"$server_step\""] {
        assert!(srun.contains(w), "{w} missing from the server srun: {srun}");
    }
}

// The start-up commands, run: run.rs.
mod run;
mod tcp;
