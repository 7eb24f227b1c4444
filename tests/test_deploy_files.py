"""examples/deploy: every file parses and is checked by the tool that will
read it (promtool, systemd-analyze, allocdiag's own argument parser); the
dashboard's queries use only metric names a real exporter emits; the
capabilities the unit files and the DaemonSet grant are enough, measured by
running allocdiag with exactly those capabilities on a real target."""

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import deps
import unpriv
from diag import cli
from diag.commands import exporter as cmd
from targets import build_c, start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "examples", "deploy")
UNITS = ("allocdiag-exporter.service", "allocdiag-exporter-textfile.service",
         "allocdiag-exporter-textfile.timer")
INSTALLED_BINARY = "/usr/local/bin/allocdiag"
METRIC_NAME = re.compile(r"\ballocdiag_[a-z0-9_]+\b")
# Grafana's own variables, replaced by something Prometheus accepts
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "5m", "$group": ".*"}


def path(name):
    return os.path.join(DEPLOY, name)


def load_yaml(name):
    """The documents of a YAML file (PyYAML comes with the test extra)."""
    import yaml
    with open(path(name)) as f:
        return list(yaml.safe_load_all(f))


def exporter_argv_ok(argv):
    """ARGV (after the program name) is accepted by allocdiag's parser."""
    args = cli.build_parser().parse_args(argv)
    assert args.command == "exporter"
    return args


# -- Kubernetes ------------------------------------------------------------------------------

def test_daemonset_hostpid_ptrace_only_what_is_needed():
    docs = load_yaml("daemonset.yaml")
    ns = next(d for d in docs if d["kind"] == "Namespace")
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    # baseline/restricted forbid SYS_PTRACE: the namespace says privileged
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert ds["metadata"]["namespace"] == ns["metadata"]["name"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert not spec.get("hostNetwork")
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"]["add"]) == {"SYS_PTRACE", "DAC_READ_SEARCH"}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert not sc.get("privileged")
    for kind in ("limits", "requests"):
        assert {"cpu", "memory"} <= set(c["resources"][kind])
    args = exporter_argv_ok(c["args"])
    port = args.listen[1]
    assert c["ports"][0]["containerPort"] == port
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)


# -- Prometheus --------------------------------------------------------------------------

def _jobs(name):
    (doc,) = load_yaml(name)
    return doc["scrape_configs"]


def test_scrape_configs_pass_promtool(tmp_path):
    promtool = deps.need("promtool")
    jobs = _jobs("prometheus.yml")
    # the host job scrapes the exporter's default address
    assert jobs[0]["static_configs"][0]["targets"] == [cmd.DEFAULT_LISTEN]
    k8s = _jobs("prometheus-kubernetes.yml")
    assert [j["job_name"] for j in k8s] == ["allocdiag-kubernetes"]
    # Debian's prometheus is built without Kubernetes discovery: check the
    # job's relabelling with a static target in its place.
    for j in k8s:
        assert j.pop("kubernetes_sd_configs")[0]["role"] == "pod"
        j["static_configs"] = [{"targets": ["127.0.0.1:9731"]}]
    full = {"global": {"scrape_interval": "15s"}, "scrape_configs": jobs + k8s}
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(json.dumps(full))        # JSON is YAML
    r = subprocess.run([promtool, "check", "config", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


# -- Grafana -----------------------------------------------------------------------------

def _dashboard():
    with open(path("grafana-dashboard.json")) as f:
        return json.load(f)


def _panels(dash):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", ())


def _exprs(dash):
    out = [t["expr"] for p in _panels(dash) for t in p.get("targets", ())]
    out += [v["definition"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return out


@pytest.fixture(scope="module")
def emitted_names():
    """Every sample name of a real --once run with a live jemalloc target."""
    from prometheus_client.parser import text_string_to_metric_families
    with start([build_c("burst.c"), "8", "64", "1"], allocator="jemalloc") as t:
        r = subprocess.run([sys.executable, "-m", "diag", "exporter", "--once", "--target",
                            str(t.pid)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    names = {s.name for f in text_string_to_metric_families(r.stdout) for s in f.samples}
    if not any(n.startswith("allocdiag_cgroup_") for n in names):
        # no memory cgroup readable here (a chroot, some CI runners): the
        # exporter leaves those gauges out; on a host it emits what it declares
        from diag import metrics
        names |= {metrics.exposed_name(m) for m in metrics.CGROUP_METRICS.values()}
    return names


def test_dashboard_is_portable_and_queries_only_emitted_metrics(emitted_names, tmp_path):
    dash = _dashboard()
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    ds_var = next(v for v in dash["templating"]["list"] if v["name"] == "datasource")
    assert ds_var["type"] == "datasource" and ds_var["query"] == "prometheus"
    for p in _panels(dash):
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
    exprs = _exprs(dash)
    used = {n for e in exprs for n in METRIC_NAME.findall(e)}
    assert used, "no allocdiag metric in the dashboard"
    assert used <= emitted_names, sorted(used - emitted_names)
    assert all(METRIC_NAME.search(e) for e in exprs)
    # every query is valid PromQL: promtool checks them as recording rules
    promtool = deps.need("promtool")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": _fill(e)}
        for i, e in enumerate(x for x in exprs if not x.startswith("label_values"))]}]}
    f = tmp_path / "rules.yml"
    f.write_text(json.dumps(rules))
    r = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _fill(expr):
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr


def test_dashboard_has_the_three_panels(emitted_names):
    panels = list(_panels(_dashboard()))
    stacked = [p for p in panels if "allocdiag_memory_bytes" in json.dumps(p["targets"])
               and p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"]
    assert stacked and stacked[0]["repeat"] == "group"
    assert stacked[0]["fieldConfig"]["defaults"]["unit"] == "bytes"
    rss_vs = [p for p in panels if {"allocdiag_target_rss_bytes",
                                    "allocdiag_allocator_resident_bytes"}
              <= set(METRIC_NAME.findall(json.dumps(p["targets"])))
              and p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "none"]
    assert rss_vs
    stair = [p for p in panels if p.get("timeFrom") == "7d"]
    assert stair and {"allocdiag_allocator_resident_bytes", "allocdiag_allocator_allocated_bytes"} \
        <= set(METRIC_NAME.findall(json.dumps(stair[0]["targets"])))


# -- systemd -----------------------------------------------------------------------------------

def _unit(name):
    p = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    p.optionxform = str
    p.read(path(name))
    return p


def _exec_start(name):
    argv = shlex.split(_unit(name)["Service"]["ExecStart"])
    assert argv[0] == INSTALLED_BINARY
    return argv[1:]


def test_unit_files_verify(tmp_path):
    for name in ("allocdiag-exporter.service", "allocdiag-exporter-textfile.service"):
        args = exporter_argv_ok(_exec_start(name))
        u = _unit(name)["Service"]
        assert set(u["CapabilityBoundingSet"].split()) == set(u["AmbientCapabilities"].split())
        assert u["ProtectSystem"] == "strict" and u["NoNewPrivileges"] == "yes"
        assert "@debug" in u["SystemCallFilter"]        # ptrace is in @debug only
    assert args.textfile == "/var/lib/prometheus/node-exporter"
    textfile_unit = _unit("allocdiag-exporter-textfile.service")["Service"]
    assert textfile_unit["ReadWritePaths"] == args.textfile
    assert _unit("allocdiag-exporter-textfile.timer")["Timer"]["OnUnitActiveSec"]
    analyze = deps.need("systemd-analyze")
    # verify checks that ExecStart exists: point it at this checkout's entry point
    binary = os.path.join(os.path.dirname(sys.executable), "allocdiag")
    assert os.access(binary, os.X_OK), binary
    for name in UNITS:
        with open(path(name)) as f:
            (tmp_path / name).write_text(f.read().replace(INSTALLED_BINARY, binary))
    r = subprocess.run([analyze, "verify", *[str(tmp_path / n) for n in UNITS]],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and not r.stderr.strip(), r.stdout + r.stderr


# System calls the tracer makes (collectors/engine/tracee.py, memory.py, remote.py);
# the units' SystemCallFilter must allow every one.
TRACER_SYSCALLS = {"ptrace", "process_vm_readv", "process_vm_writev", "wait4", "tgkill",
                   "rt_sigprocmask", "prctl", "sched_setscheduler", "pread64", "openat"}


def _expand_filter(analyze, groups, seen=None):
    """The system call names of systemd filter GROUPS, nested groups expanded."""
    seen = set() if seen is None else seen
    names = set()
    for g in groups:
        if g in seen:
            continue
        seen.add(g)
        if not g.startswith("@"):
            names.add(g)
            continue
        out = subprocess.run([analyze, "syscall-filter", g], capture_output=True, text=True,
                             check=True).stdout
        items = [ln.strip() for ln in out.splitlines()[1:]
                 if ln.strip() and not ln.strip().startswith("#")]
        names |= _expand_filter(analyze, items, seen)
    return names


def test_unit_syscall_filter_allows_what_the_tracer_calls():
    analyze = deps.need("systemd-analyze")
    for name in ("allocdiag-exporter.service", "allocdiag-exporter-textfile.service"):
        allowed = _expand_filter(analyze, _unit(name)["Service"]["SystemCallFilter"].split())
        assert TRACER_SYSCALLS <= allowed, (name, sorted(TRACER_SYSCALLS - allowed))


# -- the capabilities are enough (and needed) --------------------------------------------------

def _caps(text):
    return [c.removeprefix("CAP_").lower() for c in text.split()]


def _inspect_with(pid, setpriv_args):
    """allocdiag inspect --json PID under setpriv SETPRIV_ARGS: (allocator, resident)."""
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": unpriv._tree(), "PYTHONDONTWRITEBYTECODE": "1",
           "LANG": "C.UTF-8"}
    r = subprocess.run([setpriv, *setpriv_args, unpriv.interpreter(), "-s", "-m", "diag",
                        "inspect", "--json", str(pid)], capture_output=True, text=True, env=env,
                       cwd="/", timeout=60)
    doc = json.loads(r.stdout)
    return doc["allocator"]["kind"], doc["stats"]["resident"]["value"]


def _as_user(caps):
    s = ",".join(f"+{c}" for c in caps)
    return ["--reuid=65534", "--regid=65534", "--clear-groups", f"--inh-caps=-all,{s}",
            f"--ambient-caps=-all,{s}", f"--bounding-set=-all,{s}"]


def test_unit_capabilities_are_enough_for_a_root_target():
    # DynamicUser: an unprivileged uid holding only the unit's ambient capabilities
    caps = _caps(_unit("allocdiag-exporter.service")["Service"]["AmbientCapabilities"])
    assert set(caps) == {"sys_ptrace", "dac_read_search"}
    with start([build_c("burst.c"), "8", "64", "1"], allocator="jemalloc") as t:
        kind, resident = _inspect_with(t.pid, _as_user(caps))
        assert kind == "jemalloc" and resident and resident > 8 << 20
        # and each is needed: without CAP_DAC_READ_SEARCH /proc/PID/auxv is refused
        assert _inspect_with(t.pid, _as_user(["sys_ptrace"]))[1] is None


def test_daemonset_capabilities_are_enough_for_another_users_target(tmp_path):
    # the pod runs as uid 0 with only the added capabilities; the target is
    # another user's process (most containers on a node)
    (ds,) = [d for d in load_yaml("daemonset.yaml") if d["kind"] == "DaemonSet"]
    add = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]
    caps = [c.lower() for c in add]
    exe = tmp_path / "burst"
    shutil.copy(build_c("burst.c"), exe)
    os.chmod(tmp_path, 0o755)
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(exe), "8", "64", "1"]
    with start(argv, allocator="jemalloc") as t:
        # start() runs setpriv, which execs the target: same pid
        as_root = [f"--bounding-set=-all,{','.join('+' + c for c in caps)}", "--inh-caps=-all"]
        kind, resident = _inspect_with(t.pid, as_root)
        assert kind == "jemalloc" and resident and resident > 8 << 20
        assert _inspect_with(t.pid, ["--bounding-set=-all,+sys_ptrace", "--inh-caps=-all"])[1] \
            is None
