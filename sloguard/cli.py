"""The `sloguard` command line."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from sloguard import __version__
from sloguard.core.config import ConfigError, LoadedSettings
from sloguard.settings import load_settings

app = typer.Typer(
    help="sloguard: interference detection and SLO guardrails for co-located Kubernetes nodes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")
rules_app = typer.Typer(help="Work with rule files.", no_args_is_help=True)
app.add_typer(rules_app, name="rules")
policies_app = typer.Typer(help="Work with escalation policy files.", no_args_is_help=True)
app.add_typer(policies_app, name="policies")
score_app = typer.Typer(help="Score detectors on public benchmarks.", no_args_is_help=True)
app.add_typer(score_app, name="score")
silence_app = typer.Typer(help="Mute alerts: add, list and expire silences (through the "
                               "agent's API, like amtool).", no_args_is_help=True)
app.add_typer(silence_app, name="silence")

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: $SLOGUARD_CONFIG)"),
]
DataDirOpt = Annotated[
    Path | None, typer.Option("--data-dir", help="where the embedded store lives [./data]")
]
ListenOpt = Annotated[
    str | None, typer.Option("--listen", help="HOST:PORT of the UI/API [127.0.0.1:8080]")
]


def _load(config: Path | None, data_dir: Path | None, listen: str | None) -> LoadedSettings:
    overrides: dict[str, tuple[str, Any]] = {}
    if data_dir is not None:
        overrides["data_dir"] = ("--data-dir", data_dir)
    if listen is not None:
        overrides["listen"] = ("--listen", listen)
    try:
        return load_settings(config, overrides)
    except ConfigError as exc:
        typer.echo(f"sloguard: configuration error:\n{exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def run(config: ConfigOpt = None, data_dir: DataDirOpt = None, listen: ListenOpt = None) -> None:
    """Run the node agent with its web UI and API."""
    settings = _start_logging(_load(config, data_dir, listen).settings)
    from sloguard.agent import Agent

    def agent(settings: Any) -> Agent:
        built = Agent(settings)
        built.settle_heap = True  # alone in this process: its heap may be frozen (gc)
        return built

    _serve(settings, agent, "UI and API")


@app.command()
def server(config: ConfigOpt = None, data_dir: DataDirOpt = None,
           listen: ListenOpt = None) -> None:
    """Run the cluster view: the same UI for every node, fed by the agents' `forward:`."""
    settings = _start_logging(_load(config, data_dir, listen).settings)
    from sloguard.cluster import ClusterServer
    from sloguard.core.config import secret_sources

    if not secret_sources(settings.server, "ingest_token") and \
            not settings.server.node_tokens_file and settings.server.node_auth != "tokenreview":
        typer.echo("sloguard: configuration error:\nserver.node_tokens_file, "
                   "server.node_auth: tokenreview or server.ingest_token: one is required "
                   "(ingest_token may be given as "
                   "ingest_token_file or ingest_token_env): the tokens agents send with their "
                   "incidents; they must differ from ui.token", err=True)
        raise typer.Exit(2)
    _serve(settings, ClusterServer, "cluster UI and API")


def _start_logging(settings: Any) -> Any:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return settings


def _serve(settings: Any, build: Any, what: str) -> None:
    """Build the agent (or cluster server) and serve its app until SIGTERM; an unusable data
    directory is a bad configured value (exit 2), a port that cannot be bound exits 1."""
    import uvicorn

    from sloguard.core.config import ConfigError
    from sloguard.store import StoreError
    from sloguard.ui.app import create_app, server_options

    try:
        subject = build(settings)
    except (StoreError, ConfigError) as exc:
        typer.echo(f"sloguard: {exc}", err=True)
        raise typer.Exit(2) from None
    host, port = settings.listen_host_port
    tls = server_options(settings)
    logging.getLogger(__name__).info("%s on %s://%s:%d", what, "https" if tls else "http",
                                     host, port)
    # h11, not httptools even where it is installed (uvicorn picks it then): h11 refuses a
    # request whose headers pass 16 KiB, httptools keeps whatever a client sends, and one
    # connection's 200 MB of headers grew a uvicorn process by 235 MB
    # (tests/test_agent_e2e.py; what httptools saves is in docs/performance.md)
    server = _uvicorn_server()(uvicorn.Config(
        create_app(subject), host=host, port=port, log_level=settings.log_level,
        access_log=False, timeout_graceful_shutdown=10, http="h11", **tls,
    ))
    server.run()
    if not server.started:
        raise typer.Exit(1)


def _uvicorn_server() -> type:
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        """SIGTERM is how Kubernetes stops the agent: once flushed, exit 0, not by the signal.

        uvicorn re-raises the signals it caught after its graceful shutdown; a stop that
        completed cleanly should not look like a crash to the supervisor.
        """

        _wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

        def handle_exit(self, sig: int, frame: object) -> None:
            super().handle_exit(sig, frame)
            captured = getattr(self, "_captured_signals", None)
            if sig == signal.SIGTERM and captured and captured[-1] == sig:
                captured.pop()
            if self._wake is not None:  # from a signal handler: wake the loop through its pipe
                loop, wake = self._wake
                with contextlib.suppress(RuntimeError):  # the loop already closed
                    loop.call_soon_threadsafe(wake.set)

        async def main_loop(self) -> None:
            """uvicorn's own loop wakes ten times a second to look for a stop: 0.17% of a core
            on an idle node, a tenth of the 100-cgroup agent's whole cost
            (benchmarks/agent_overhead.py). This one wakes once a second (the Date header's
            own pace) and at once when a signal asks it to stop."""
            wake = asyncio.Event()
            self._wake = (asyncio.get_running_loop(), wake)
            counter = 0
            should_exit = await self.on_tick(counter)
            while not should_exit:
                counter = (counter + 10) % 864000  # on_tick refreshes the Date every 10th
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), 1.0)
                should_exit = await self.on_tick(counter)

    return Server


@config_app.command("show")
def config_show(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    listen: ListenOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Print the effective configuration and where each value came from."""
    from sloguard.forwarder import redact_url

    loaded = _load(config, data_dir, listen)
    # the forwarder's URL may carry credentials (userinfo, a proxy's key in the query)
    rows = [(k, redact_url(v) if k == "forward.url" and v else v, s)
            for k, v, s in loaded.effective()]
    if as_json:
        typer.echo(json.dumps(
            [{"key": k, "value": v, "source": s} for k, v, s in rows], default=str, indent=2))
        return
    width = max(len(k) for k, _, _ in rows)
    for key, value, source in rows:
        shown = json.dumps(value, default=str)
        typer.echo(f"{key:<{width}}  {shown}  # {source}")


@rules_app.command("check")
def rules_check(
    files: Annotated[list[Path], typer.Argument(help="rule files or directories of *.yaml")],
    config: ConfigOpt = None,
) -> None:
    """Check rule files as the agent would load them; print every problem as
    file:line:column: field: message, and exit 1 if there is any."""
    from sloguard.detector.registry import DetectorRegistry
    from sloguard.detector.rules import RuleSet

    settings = _load(config, None, None).settings
    registry = DetectorRegistry.from_config(settings.detectors)
    for name, problem in registry.errors.items():
        typer.echo(f"warning: detector plugin {name}: {problem}", err=True)
    loaded, problems = RuleSet([str(f) for f in files], registry.check).check()
    for path, rules in loaded:
        typer.echo(f"{path}: {len(rules)} rules ok")
    _fail_on(problems)


@policies_app.command("check")
def policies_check(
    files: Annotated[list[Path], typer.Argument(help="policy files or directories of *.yaml")],
    config: ConfigOpt = None,
) -> None:
    """Check escalation policy files as the agent would load them; print every problem as
    file:line:column: field: message, and exit 1 if there is any."""
    from sloguard.actuators.env import ActuatorEnv
    from sloguard.actuators.kinds import StepFactory
    from sloguard.actuators.policy import PolicySet

    settings = _load(config, None, None).settings
    factory = StepFactory(ActuatorEnv(settings.node_name, ledger=None))  # type: ignore[arg-type]
    loaded, problems = PolicySet([str(f) for f in files], factory.check,
                                 factory.cannot_stand).check()
    for path, policies in loaded:
        names = ", ".join(p.name for p in policies)
        typer.echo(f"{path}: {len(policies)} policies ok ({names})")
    _fail_on(problems)


def _fail_on(problems: list[str]) -> None:
    """Print every problem a check found (file:line:column: field: message); exit 1 if any."""
    for problem in problems:
        typer.echo(problem, err=True)
    if problems:
        raise typer.Exit(1)


@rules_app.command("schema")
def rules_schema() -> None:
    """Print the JSON Schema of rule files (for editors; docs/rules.schema.json is this)."""
    from sloguard.detector.rules import rule_file_schema

    typer.echo(json.dumps(rule_file_schema(), indent=2))


def _moment(text: str) -> int:
    """ns since the epoch from `now`, `-1h` (relative to now), an ISO 8601 time or epoch secs."""
    from datetime import UTC, datetime

    from sloguard.core.units import parse_duration

    text = text.strip()
    if text == "now":
        return time.time_ns()
    if text.startswith("-"):
        return time.time_ns() - int(parse_duration(text[1:]) * 1e9)
    try:
        return int(float(text) * 1e9)
    except ValueError:
        pass
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1e9)


@app.command()
def backtest(
    rules: Annotated[list[Path], typer.Option("--rules", help="rule files or directories")],
    start: Annotated[str, typer.Option("--from", help="now, -1h, ISO 8601 or epoch seconds")],
    end: Annotated[str, typer.Option("--to", help="as --from")] = "now",
    step: Annotated[str, typer.Option(help="evaluation step, e.g. 1s")] = "",
    plot: Annotated[Path | None, typer.Option(help="draw the incidents' series to a PNG")] = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Replay stored history through rules: what would have fired, when, what would have run."""
    from datetime import UTC, datetime

    from sloguard.backtest import backtest as run_backtest
    from sloguard.backtest import plot as draw
    from sloguard.core.units import parse_duration
    from sloguard.detector.registry import DetectorRegistry
    from sloguard.detector.rules import RuleSet
    from sloguard.store import StoreError
    from sloguard.store.factory import open_configured_store

    settings = _load(config, data_dir, None).settings
    try:
        start_ns, end_ns = _moment(start), _moment(end)
        step_s = parse_duration(step) if step else settings.interval
    except ValueError as exc:
        typer.echo(f"sloguard: {exc}", err=True)
        raise typer.Exit(2) from None
    if end_ns <= start_ns or step_s <= 0:
        typer.echo("sloguard: --to must be after --from, and --step positive", err=True)
        raise typer.Exit(2)
    registry = DetectorRegistry.from_config(settings.detectors)
    ruleset = RuleSet([str(r) for r in rules], validate_params=registry.check)
    ruleset.reload()
    if ruleset.errors:
        for problem in ruleset.errors.values():
            typer.echo(problem, err=True)
        raise typer.Exit(1)
    database = settings.data_dir / "samples.db"
    if settings.store.kind == "embedded" and not database.exists():
        typer.echo(f"sloguard: no stored history at {database}", err=True)
        raise typer.Exit(2)
    try:
        store = open_configured_store(settings.store, settings.data_dir, writer=False)
    except (StoreError, ConfigError) as exc:
        typer.echo(f"sloguard: {exc}", err=True)
        raise typer.Exit(2) from None

    def progress(done: float) -> None:
        typer.echo(f"  replayed {done:4.0%}", err=True)

    try:
        result = run_backtest(store, ruleset, registry, start_ns, end_ns, step_s,
                              node=settings.node_name, progress=progress)
    except StoreError as exc:
        typer.echo(f"sloguard: cannot read the history: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        store.close()

    def when(ns: int | None) -> str:
        return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S") if ns else "-"

    typer.echo(f"{len(ruleset.rules)} rules, {result.samples} samples, "
               f"{result.evaluations} evaluations every {step_s:g}s: "
               f"{len(result.incidents)} incidents")
    for incident in result.incidents:
        series = ", ".join(f"{k}={v}" for k, v in incident.series.items() if k != "node")
        state = "still firing at the end" if incident.state == "firing" else incident.state
        typer.echo(f"- {incident.group}/{incident.rule} [{incident.severity}] {series}\n"
                   f"    pending {when(incident.started_ns)}  fired {when(incident.fired_ns)}  "
                   f"resolved {when(incident.resolved_ns)}  ({state}, peak {incident.peak})\n"
                   f"    {incident.summary}")
        for action in incident.actions:
            typer.echo(f"    would {action.step} {action.target}: {action.detail}")
    for key, error in result.rule_errors.items():
        typer.echo(f"rule {key} failed: {error}", err=True)
    if plot is not None:
        draw(result, plot)
        typer.echo(f"plot: {plot}")


@app.command()
def lab(
    scenarios: Annotated[list[str] | None, typer.Argument(
        help="scenario files or shipped names (cpu, cache, io, vm) [all shipped]")] = None,
    out: Annotated[Path, typer.Option(help="results and report.md go here")] = Path("lab-out"),
    short: Annotated[bool, typer.Option(
        help="shorter periods (10 s quiet, 25 s episodes, one episode): a quick look")] = False,
    kubeconfig: Annotated[str | None, typer.Option(
        help="act on this API server's Node (the lab registers it); unset: Kubernetes steps "
             "in shadow mode")] = None,
    report_only: Annotated[bool, typer.Option(
        help="rebuild the report from results already in --out")] = False,
    repeat: Annotated[int, typer.Option(
        min=1, help="run each scenario's three ways N times; targets are judged on the median "
                    "of the runs' ratios")] = 1,
    kube: Annotated[bool, typer.Option(
        help="also run each scenario with LS and BE as pods on --node (a real kubelet node: "
             "this machine), as <name>-kube in the same report; needs --kubeconfig")] = False,
    node: Annotated[str | None, typer.Option(
        help="--kube: the node's name [this machine's hostname]")] = None,
    kube_image: Annotated[str, typer.Option(
        help="--kube: the pods' image, with redis-server and stress-ng "
             "(deploy/lab/workload.Dockerfile), present on the node")] = "sloguard-lab/workload:1",
) -> None:
    """Run interference scenarios on this machine: an LS service under open-loop load, BE
    antagonists on a schedule, the agent guarding it or not; writes a report with plots."""
    from sloguard.lab.antagonists import LabSetupError
    from sloguard.lab.scenario import (
        SCENARIO_DIR,
        ScenarioError,
        find_scenario,
        load_scenario,
        shortened,
        timeline,
    )
    from sloguard.lab.session import (
        load_session,
        run_session,
        session_seconds,
        write_report,
    )

    names = scenarios or sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))
    try:
        specs = [load_scenario(find_scenario(name)) for name in names]
    except ScenarioError as exc:
        typer.echo(f"sloguard: {exc}", err=True)
        raise typer.Exit(2) from None
    twice = sorted({s.name for s in specs if [t.name for t in specs].count(s.name) > 1})
    if twice:
        typer.echo(f"sloguard: scenario {', '.join(twice)} given more than once (to run a "
                   "scenario several times: --repeat N)", err=True)
        raise typer.Exit(2)
    if short:
        specs = [shortened(s, quiet=10, episode=25, episodes=1) for s in specs]
    pods = None
    if kube:
        if not kubeconfig:
            typer.echo("sloguard: --kube needs --kubeconfig (the API server of the node)",
                       err=True)
            raise typer.Exit(2)
        import socket

        from sloguard.lab.pods import PodPlacement
        from sloguard.lab.session import with_pods

        specs = with_pods(specs)
        if not report_only:
            pods = PodPlacement(kubeconfig, node or socket.gethostname(), kube_image)
    if report_only:
        scenarios = load_session(specs, out)
        if not scenarios:
            typer.echo(f"sloguard: no lab results in {out}", err=True)
            raise typer.Exit(2)
        typer.echo(f"report: {write_report(scenarios, out, kubeconfig)}")
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    lengths = {s.name: timeline(s)[1] for s in specs}  # seconds of one way
    fractions: dict[tuple[str, int, str], float] = {}
    with Progress(TextColumn("{task.description:32s}"), BarColumn(),
                  TextColumn("{task.percentage:>3.0f}%"), TimeRemainingColumn(),
                  refresh_per_second=1) as bar:
        task = bar.add_task("lab", total=session_seconds(specs, repeat))

        def progress(scenario: str, run: int, fraction: float, way: str) -> None:
            if (scenario, run, way) not in fractions and not bar.console.is_terminal:
                # no live bar in a log (CI, nohup): a line as each way starts, with the time
                typer.echo(f"{time.strftime('%H:%M:%S')} lab: {scenario}: {way}"
                           + (f" (run {run}/{repeat})" if repeat > 1 else ""))
            fractions[(scenario, run, way)] = fraction
            bar.update(task, completed=sum(f * lengths[name]
                                           for (name, _, _), f in fractions.items()),
                       description=f"{scenario}: {way}"
                                   + (f" (run {run}/{repeat})" if repeat > 1 else ""))

        def stop(signum: int, frame: object) -> None:
            raise KeyboardInterrupt  # every way's `finally` then removes what it started

        signal.signal(signal.SIGTERM, stop)
        try:
            scenarios = run_session(specs, out, progress, kubeconfig=kubeconfig,
                                    repeats=repeat, pods=pods)
        except LabSetupError as exc:
            typer.echo(f"sloguard: the lab cannot run here: {exc}", err=True)
            raise typer.Exit(2) from None
    typer.echo(f"report: {out / 'report.md'}")
    for scenario in scenarios:
        for k, report in enumerate(scenario.runs, start=1):
            for way, stats in report.stats.items():
                typer.echo(f"  {report.spec.name:6s} {f'run {k} ' if repeat > 1 else ''}"
                           f"{way:9s} p99 {stats.p99_ms:7.3f} ms  "
                           f"in episodes {stats.episode_p99_ms:7.3f} ms  "
                           f"BE {stats.be_ops_per_s:9.0f} ops/s")  # bogo-ops, or a program's runs


# The project's best general detector on NAB, with its own defaults (docs/plugins.md, "NAB").
DEFAULT_NAB_DETECTOR = "anomaly_channels"


def _detector_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`name:key=value,key=value` -> (name, params); values parsed as YAML scalars."""
    import yaml

    name, _, rest = spec.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"detector parameter {item!r} is not key=value")
        params[key.strip()] = yaml.safe_load(value)
    return name.strip(), params


@score_app.command("nab")
def score_nab(
    out: Annotated[Path, typer.Option(help="where the results CSVs are written")],
    root: Annotated[Path | None, typer.Argument(
        help="a NAB repository (data/, labels/combined_windows.json, config/profiles.json) "
             "or the shared subset (data/, windows.json, profiles.json)")] = None,
    root_option: Annotated[Path | None, typer.Option(
        "--root", help="the same as ROOT")] = None,
    data: Annotated[Path | None, typer.Option(
        help="NAB data/ directory (<category>/<file>.csv), instead of ROOT")] = None,
    windows: Annotated[Path | None, typer.Option(
        help="NAB windows.json (combined_windows.json), instead of ROOT")] = None,
    detector: Annotated[str, typer.Option(help="name:key=value,... of any loaded detector")] = (
        DEFAULT_NAB_DETECTOR),
    profiles: Annotated[Path | None, typer.Option(
        help="profiles.json (default: ROOT's, else the one beside the windows file)")] = None,
    config: ConfigOpt = None,
) -> None:
    """Run a detector causally over NAB-format CSVs; print the normalised NAB score of each
    profile and event-level precision, recall, F1 and mean detection delay."""
    from sloguard.detector.registry import DetectorRegistry
    from sloguard.detector.scoring import nab

    settings = _load(config, None, None).settings
    try:
        data, windows, profile_file = nab.locate(root_option or root, data, windows, profiles)
        name, params = _detector_spec(detector)
        registry = DetectorRegistry.from_config(settings.detectors)
        registry.make(name, params)  # refuse a bad spec before reading anything
        weights = {k: v["CostMatrix"] for k, v in json.loads(profile_file.read_text()).items()}
        files = nab.load(data, windows)
    except (ValueError, OSError, KeyError) as exc:
        typer.echo(f"sloguard: {exc}", err=True)
        raise typer.Exit(2) from None
    if not files:
        typer.echo(f"sloguard: none of the files in {windows} is under {data}", err=True)
        raise typer.Exit(2)
    done = []

    def progress(file_name: str) -> None:
        done.append(file_name)
        typer.echo(f"  [{len(done)}/{len(files)}] {file_name}", err=True)

    try:
        nab.run_detector(files, lambda: registry.make(name, params), progress)
    except ValueError as exc:
        typer.echo(f"sloguard: {exc}", err=True)
        raise typer.Exit(1) from None
    nab.write_results(files, out)
    scores = nab.score(files, weights)
    typer.echo(f"{len(files)} files, {sum(len(f.windows) for f in files)} windows, "
               f"detector {name} {params}")
    typer.echo("| profile | NAB score | threshold |\n|---|---|---|")
    for result in scores:
        typer.echo(f"| {result.profile} | {result.normalized:.1f} | {result.threshold:.4f} |")
    standard = next((s for s in scores if s.profile == "standard"), scores[0])
    ev = nab.events(files, standard.threshold)
    typer.echo(f"events at the {standard.profile} threshold: precision {ev.precision:.2f}, "
               f"recall {ev.recall:.2f}, F1 {ev.f1:.2f}, {ev.false_alarms} false alarms, mean "
               f"delay {ev.mean_delay_rows:.1f} rows ({ev.mean_delay_s / 60:.0f} min)")
    typer.echo(f"results: {out}")


@score_app.command("tcpd")
def score_tcpd(
    root: Annotated[Path | None, typer.Argument(
        help="a TCPD checkout: datasets/<name>/<name>.json and "
             "analysis/annotations/annotations.json (or annotations.json at the root)")] = None,
    root_option: Annotated[Path | None, typer.Option("--root", help="the same as ROOT")] = None,
    data: Annotated[Path | None, typer.Option(help="the datasets/ directory [ROOT/datasets]")]
    = None,
    annotations: Annotated[Path | None, typer.Option(
        help="the annotations.json [ROOT/analysis/annotations/annotations.json]")] = None,
    method: Annotated[str, typer.Option(help="grid, binseg, pelt or kernel")] = "grid",
    cost: Annotated[str | None, typer.Option(
        help="linear or constant [linear; constant with kernel]")] = None,
    penalty: Annotated[float, typer.Option(
        help="penalty factor (x log n x the residual variance of the no-change fit)")] = 3.0,
    min_size: Annotated[int, typer.Option(help="fewest points of a segment")] = 5,
) -> None:
    """F1 (margin 5) and segmentation cover of the change-point detector's segmentation on a
    TCPD-format benchmark, on the univariate series and on all of them (a multivariate series
    is segmented jointly, each dimension standardised), next to the "no change points" baseline
    from the same run."""
    from sloguard.detector.scoring import tcpd
    from sloguard.plugins.changepoint import make_algorithm
    from sloguard.plugins.changepoint import penalty as penalty_of

    if root is not None and root_option is not None and root != root_option:
        typer.echo("sloguard: give the TCPD root once (ROOT or --root)", err=True)
        raise typer.Exit(2)
    root = root or root_option
    cost = cost or ("constant" if method == "kernel" else "linear")
    try:
        algorithm = make_algorithm(method, min_size, cost)
        if root is not None and (data is None or annotations is None):
            found = tcpd.locate(root)
            data, annotations = data or found[0], annotations or found[1]
        if data is None or annotations is None:
            raise ValueError("give the TCPD repository's root (ROOT or --root), or both --data "
                             "and --annotations")
        series = tcpd.load(data, annotations)
    except (ValueError, OSError) as exc:
        typer.echo(f"sloguard: {exc}", err=True)
        raise typer.Exit(2) from None
    if not series:
        typer.echo(f"sloguard: no annotated data set found under {data}", err=True)
        raise typer.Exit(2)

    def segment(x: Any) -> list[int]:
        pen = penalty_of(x, penalty, cost)
        return [int(b) for b in algorithm.fit(x).predict(pen=pen)[:-1]]

    results = tcpd.evaluate(series, segment)
    uni = tcpd.summary([r for r in results if r.dimensions == 1])
    every = tcpd.summary(results)
    typer.echo(f"{every.series} series ({uni.series} univariate), changepoint method={method} "
               f"cost={cost} penalty={penalty:g} min_size={min_size}")
    typer.echo(f"| detector | F1 univariate | cover univariate | F1 all {every.series} | "
               f"cover all {every.series} |\n|---|---|---|---|---|")
    typer.echo(f"| no change points | {uni.baseline_f1:.3f} | {uni.baseline_cover:.3f} | "
               f"{every.baseline_f1:.3f} | {every.baseline_cover:.3f} |")
    typer.echo(f"| changepoint ({method}, {cost}) | {uni.f1:.3f} | {uni.cover:.3f} | "
               f"{every.f1:.3f} | {every.cover:.3f} |")


# -- silences: the CLI talks to the agent's API (as amtool does to Alertmanager's), so the
# agent validates, the change is applied at its next tick, and the UI token guards it.

UrlOpt = Annotated[str | None, typer.Option(
    "--url", help="the agent's UI/API [http://<listen> from the config]")]


def _api(config: Path | None, url: str | None, method: str, path: str,
         body: Any = None) -> Any:
    import urllib.error
    import urllib.request

    from sloguard.core.config import SecretUnavailable, read_secret

    settings = _load(config, None, None).settings
    if url is None:
        host, port = settings.listen_host_port
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        scheme = "https" if settings.ui.tls_cert_file else "http"
        url = f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
    headers = {"Accept": "application/json"}
    try:
        token = read_secret(settings.ui, "token")
    except SecretUnavailable as exc:
        typer.echo(f"sloguard: the UI token cannot be read: {exc}", err=True)
        raise typer.Exit(2) from None
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url.rstrip("/") + path, data=data, headers=headers,
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("detail")
        except ValueError:
            detail = exc.reason
        if isinstance(detail, list):  # FastAPI's validation errors
            detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}"
                               for d in detail)
        typer.echo(f"sloguard: {method} {path}: HTTP {exc.code}: {detail}", err=True)
        raise typer.Exit(1) from None
    except (urllib.error.URLError, OSError) as exc:
        typer.echo(f"sloguard: cannot reach the agent at {url}: "
                   f"{getattr(exc, 'reason', exc)}", err=True)
        raise typer.Exit(2) from None


def _iso(ns: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@silence_app.command("add")
def silence_add(
    matchers: Annotated[list[str], typer.Argument(
        help='label matchers: alertname=LSCpuStall node="worker-7" pod=~"web-.*"')],
    comment: Annotated[str, typer.Option("--comment", "-m", help="why (required)")],
    duration: Annotated[str, typer.Option("--duration", "-d", help="e.g. 30m, 2h")] = "2h",
    until: Annotated[str | None, typer.Option(
        "--until", help="end time instead of --duration (ISO 8601 or epoch seconds)")] = None,
    start: Annotated[str | None, typer.Option(
        "--start", help="start later (ISO 8601 or epoch seconds)")] = None,
    author: Annotated[str | None, typer.Option("--author", "-a", help="[$USER]")] = None,
    config: ConfigOpt = None,
    url: UrlOpt = None,
) -> None:
    """Create a silence; prints its id."""
    import getpass

    body: dict[str, Any] = {"matchers": matchers, "comment": comment,
                            "created_by": author or getpass.getuser()}
    try:
        if start:
            body["starts_at"] = _iso(_moment(start))
        if until:
            body["ends_at"] = _iso(_moment(until))
        else:
            body["duration"] = duration
    except ValueError as exc:
        typer.echo(f"sloguard: {exc}", err=True)
        raise typer.Exit(2) from None
    created = _api(config, url, "POST", "/api/silences", body)
    typer.echo(created["id"])


@silence_app.command("list")
def silence_list(
    state: Annotated[str | None, typer.Option(
        help="active, pending or expired [active and pending]")] = None,
    show_all: Annotated[bool, typer.Option("--all", help="expired ones too")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    config: ConfigOpt = None,
    url: UrlOpt = None,
) -> None:
    """List silences, newest first."""
    query = f"?state={state}" if state else ""
    found = _api(config, url, "GET", f"/api/silences{query}")["silences"]
    if not state and not show_all:
        found = [s for s in found if s["state"] != "expired"]
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    for s in found:
        typer.echo(f"{s['id']}  {s['state']:<7}  {_iso(s['starts_ns'])} .. {_iso(s['ends_ns'])}"
                   f"  {' '.join(s['matchers'])}  by {s['created_by']}: {s['comment']}")


@silence_app.command("expire")
def silence_expire(
    ids: Annotated[list[str], typer.Argument(help="silence ids")],
    config: ConfigOpt = None,
    url: UrlOpt = None,
) -> None:
    """End silences now (the alerts they muted notify at their group's next flush)."""
    for silence_id in ids:
        from urllib.parse import quote

        _api(config, url, "DELETE", f"/api/silences/{quote(silence_id, safe='')}")
        typer.echo(f"{silence_id} expired")


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(f"sloguard {__version__}")


if __name__ == "__main__":
    app()
