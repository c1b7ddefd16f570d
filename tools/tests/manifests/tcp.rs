//! The tcp/ENA templates, kept apart from the EFA ones: config/tcp-ena.toml,
//! config/k8s/tally-server-tcp.yaml, config/k8s/worker-tcp.yaml and the
//! sbatch's `TALLY_FABRIC=tcp`. What
//! issue 56 found: EFA settings (`FI_PROVIDER=efa`, `efa-env --assume-efa`)
//! in every worker file broke the tcp case, where tally's wins were measured.
use super::*;

const TCP_TOML: &str = "config/tcp-ena.toml";
const EFA_TOML: &str = "config/c7gn.16xlarge.toml";

fn resolve(rel: &str) -> ServerConfig {
    ServerFile::parse(&read(rel)).and_then(|f| f.resolve()).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The tcp server is the EFA one with tcp's differences only, so the two
/// cannot drift apart on limits, timeouts or ports.
#[test]
fn tcp_server_config_is_the_efa_one_but_for_the_transport() {
    let tcp = resolve(TCP_TOML);
    let efa = resolve(EFA_TOML);
    assert_eq!(tcp.provider.as_deref(), Some("tcp"));
    assert_eq!(tcp.poll, "adaptive", "busy polling took about 1.6x the CPU per GB over tcp (docs/sizing.md)");
    assert_eq!(tcp.hugepages, "prefer", "tcp registers nothing with the NIC: hugepages must not be required");
    let same = ServerConfig { provider: efa.provider.clone(), poll: efa.poll.clone(), hugepages: efa.hugepages.clone(), ..tcp };
    assert_eq!(same, efa, "{TCP_TOML} differs from {EFA_TOML} beyond provider, poll and hugepages");
}

/// `doc[path]` (an existing key) replaced by `value`, or removed with None;
/// an array on the way stands for its first element.
fn set(doc: &mut Yaml, path: &[&str], value: Option<Yaml>) {
    let Yaml::Hash(h) = doc else { panic!("{path:?}: not a map") };
    let key = Yaml::String(path[0].to_string());
    if path.len() == 1 {
        // In place: a map's order is part of its equality here.
        match value {
            Some(v) => *h.get_mut(&key).unwrap_or_else(|| panic!("no {}", path[0])) = v,
            None => drop(h.remove(&key)),
        }
        return;
    }
    let next = h.get_mut(&key).unwrap_or_else(|| panic!("no {}", path[0]));
    match next {
        Yaml::Array(a) => set(&mut a[0], &path[1..], value),
        other => set(other, &path[1..], value),
    }
}

/// The tcp server manifest is the EFA one with tcp's differences only: the
/// transport settings (as config/tcp-ena.toml has them), no EFA device, no
/// `tally efa-env`, no IPC_LOCK, and memory in place of hugepages. Anything
/// else changed in one must change in the other.
#[test]
fn tcp_server_manifest_is_the_efa_one_but_for_the_transport() {
    let (efa_docs, tcp_docs) = (yaml_docs(SERVER_YAML), yaml_docs(SERVER_TCP_YAML));
    let toml = |docs: &[Yaml], rel: &str| {
        let t = text(&kind(docs, "ConfigMap")["data"]["server.toml"]);
        ServerFile::parse(&t).and_then(|f| f.resolve()).unwrap_or_else(|e| panic!("{rel} server.toml: {e}"))
    };
    let (efa, tcp) = (toml(&efa_docs, SERVER_YAML), toml(&tcp_docs, SERVER_TCP_YAML));
    let ena = resolve(TCP_TOML);
    assert_eq!((&tcp.provider, &tcp.poll, &tcp.hugepages), (&ena.provider, &ena.poll, &ena.hugepages), "as {TCP_TOML}");
    let same = ServerConfig { provider: efa.provider.clone(), poll: efa.poll.clone(), hugepages: efa.hugepages.clone(), ..tcp };
    assert_eq!(same, efa, "{SERVER_TCP_YAML}'s server.toml differs from {SERVER_YAML}'s beyond the transport");

    // The DaemonSet: the EFA one, with its EFA parts taken out, is the tcp one.
    let container = ["spec", "template", "spec", "containers"];
    let c = &kind(&tcp_docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
    let mut want = kind(&efa_docs, "DaemonSet").clone();
    let efa_script = text(&kind(&efa_docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"][0]);
    let without_efa: String = efa_script.lines().filter(|l| !l.contains("efa_env")).map(|l| format!("{l}\n")).collect();
    assert!(without_efa.len() < efa_script.len(), "{SERVER_YAML}'s command no longer evaluates efa-env: update this test");
    set(&mut want, &[&container[..], &["args"]].concat(), Some(Yaml::Array(vec![Yaml::String(without_efa)])));
    set(&mut want, &[&container[..], &["securityContext"]].concat(), None);
    set(&mut want, &[&container[..], &["resources"]].concat(), Some(c["resources"].clone()));
    assert_eq!(&want, kind(&tcp_docs, "DaemonSet"), "{SERVER_TCP_YAML}'s DaemonSet differs from {SERVER_YAML}'s beyond EFA");
    let script = text(&c["args"][0]);
    assert!(!script.contains("efa-env") && !script.contains("FI_EFA"), "the tcp server evaluates no EFA settings");

    // Resources: Guaranteed, whole CPUs as the EFA pod, no EFA and no
    // hugepages, and memory for the slabs as well as the rest.
    let (req, lim) = (&c["resources"]["requests"], &c["resources"]["limits"]);
    assert_eq!(req, lim, "requests must equal limits");
    let efa_req = &kind(&efa_docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"];
    assert_eq!(req["cpu"], efa_req["cpu"]);
    for r in ["hugepages-2Mi", "vpc.amazonaws.com/efa"] {
        assert!(req[r].is_badvalue(), "{SERVER_TCP_YAML} requests {r}");
    }
    let lcores: u64 = text(&req["cpu"]).parse::<u64>().unwrap() - 1;
    let slabs = lcores * tcp.slab_size;
    assert_eq!(bytes(&req["memory"]), slabs + bytes(&efa_req["memory"]), "memory = {lcores} slabs + the EFA pod's memory");
    assert!(bytes(&req["memory"]) + NODE_SYSTEM_MEMORY <= NODE_MEMORY);
    let line = format!("{lcores} lcores x {} MiB = {} GiB", tcp.slab_size >> 20, slabs >> 30);
    assert!(header(&read(SERVER_TCP_YAML)).replace('\n', " ").contains(&line), "the header lacks `{line}`");

    // The command, as the image's bash runs it.
    let shellcheck = tool("shellcheck");
    let mut sc = Command::new(&shellcheck).args(["-s", "bash", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut sc.stdin.take().unwrap(), script.as_bytes()).unwrap();
    let o = sc.wait_with_output().unwrap();
    assert!(o.status.success(), "shellcheck of {SERVER_TCP_YAML}'s container command:\n{}", show(&o));
}

#[test]
fn tcp_worker_job_sets_no_efa_and_runs_the_preflight() {
    let docs = yaml_docs(WORKER_TCP_YAML);
    let env = kind(&docs, "ConfigMap")["data"].as_hash().unwrap();
    let names: Vec<String> = env.keys().map(text).collect();
    assert!(names.iter().all(|n| n != "FI_PROVIDER" && !n.starts_with("FI_EFA_")), "{names:?}");
    let servers = text(&kind(&docs, "ConfigMap")["data"]["TALLY_SERVERS"]);
    let listen = port_of(&ServerManifest::load().config.listen);
    assert!(servers.split(',').all(|s| port_of(s) == listen), "{servers} vs port {listen}");

    let c = &kind(&docs, "Job")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["envFrom"][0]["configMapRef"]["name"], kind(&docs, "ConfigMap")["metadata"]["name"]);
    assert!(c["resources"]["limits"]["vpc.amazonaws.com/efa"].is_badvalue(), "EFA interfaces requested over tcp");
    assert!(c["securityContext"].is_badvalue(), "tcp pins nothing: no IPC_LOCK");
    assert_eq!(c["command"].as_vec().unwrap().iter().map(text).collect::<Vec<_>>(), ["/bin/bash", "-c"]);
    let script = text(&c["args"][0]);
    let shellcheck = tool("shellcheck");
    let mut sc = Command::new(&shellcheck).args(["-s", "bash", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut sc.stdin.take().unwrap(), script.as_bytes()).unwrap();
    let o = sc.wait_with_output().unwrap();
    assert!(o.status.success(), "shellcheck of {WORKER_TCP_YAML}'s container command:\n{}", show(&o));

    // The env line, run by the package's own parser (from the checkout), with the ConfigMap's values.
    let line = script.lines().find(|l| l.contains("python -m tally_nccl env")).expect("the env block is evaluated");
    assert!(line.contains("--provider tcp"), "{line}");
    let check = script.find("python -m tally_nccl check").expect("the preflight runs");
    assert!(check < script.find("exec torchrun").unwrap(), "the preflight runs before torchrun");
    let o = Command::new("python3")
        .args(["-m", "tally_nccl", "env", "--servers", &servers, "--provider", "tcp", "--iface"])
        .arg(text(&kind(&docs, "ConfigMap")["data"]["FI_TCP_IFACE"]))
        .env("PYTHONPATH", repo().join("python"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let block = String::from_utf8_lossy(&o.stdout);
    for want in ["export NCCL_NET=Tally\n", "export TALLY_PROVIDER=tcp\n", "unset FI_PROVIDER\n", "export NCCL_COLLNET_ENABLE=1\n"] {
        assert!(block.contains(want), "{want:?} missing from:\n{block}");
    }
}

/// The sbatch's worker step evaluates the EFA settings only when
/// TALLY_FABRIC is efa: its own text, run with this build's tally.
#[test]
fn sbatch_worker_step_leaves_efa_out_on_tcp() {
    let sbatch = read(SBATCH);
    let start = sbatch.find("    bash -c '").expect("the worker step") + "    bash -c '".len();
    let step = &sbatch[start..start + sbatch[start..].find("' || status").expect("the step's end")];
    assert!(sbatch.contains("export TALLY_PROVIDER=tcp\n    unset FI_PROVIDER\n"), "tcp sets the provider and drops FI_PROVIDER");
    for (fabric, efa_set) in [("tcp", false), ("efa", true)] {
        let o = Command::new("bash")
            .args(["-c", step])
            .env("TALLY", env!("CARGO_BIN_EXE_tally"))
            .env("TALLY_FABRIC", fabric)
            .env("TRAIN_CMD", "env")
            .env_remove("FI_EFA_USE_HUGE_PAGE")
            .env_remove("FI_PROVIDER")
            .output()
            .unwrap();
        assert!(o.status.success(), "TALLY_FABRIC={fabric}:\n{}", show(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(out.lines().any(|l| l == "FI_PROVIDER=efa"), efa_set, "TALLY_FABRIC={fabric}:\n{out}");
        assert_eq!(out.lines().any(|l| l.starts_with("FI_EFA_USE_HUGE_PAGE=")), efa_set, "TALLY_FABRIC={fabric}:\n{out}");
    }
}
