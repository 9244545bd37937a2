"""``fleetenv run``: run a policy on the tasks of a task file, write results, print a summary.

The first paragraph is the command's ``--help`` description; the flags, the checks made
before anything is provisioned (:mod:`fleetenv.cli.preflight`), the run manifest and
``--resume`` (:mod:`fleetenv.cli.resume`) and Ctrl-C (:mod:`fleetenv.cli.interrupts`)
are in docs/cli.md. ``execute()`` is the part ``fleetenv demo`` shares: run the rollouts
through the ``Runner``, stream every result to the JSONL file as it finishes (so an
interrupted run keeps what it finished), then print the summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetenv.core.errors import ConfigurationError

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.core.config import FleetConfig
    from fleetenv.core.events import Event
    from fleetenv.core.tasks import Task
    from fleetenv.core.types import RolloutResult
    from fleetenv.fleet.traces import TraceOptions
    from fleetenv.rollouts.policy_spec import PolicySpec
    from fleetenv.rollouts.runner import Runner

#: Where the OpenAI-compatible policy finds its key (never a command-line flag).
OPENAI_KEY_ENV = "OPENAI_API_KEY"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0] + "\n\n" + (
        "Runs on Fleet when FLEET_API_KEY is set, else on the embedded local Fleet. "
        f"The openai policy reads its key from {OPENAI_KEY_ENV}.")
    parser.add_argument("tasks", metavar="TASKS",
                        help="task file: a JSON array, {\"tasks\": [...]} or JSONL")
    parser.add_argument("--policy", required=True, metavar="POLICY",
                        help="reference (replay each task's reference solution), openai "
                        "(an OpenAI-compatible chat-completions server; needs --model), or "
                        "import:package.module:attribute (a Policy, a Policy class, or a "
                        "function of the PolicyContext)")
    parser.add_argument("--model", default=None,
                        help="model name for --policy openai")
    parser.add_argument("--base-url", default=None, metavar="URL",
                        help="chat-completions server for --policy openai, e.g. "
                        "http://localhost:8000/v1 (default: the policy's default, OpenAI)")
    sampling = parser.add_argument_group("sampling (--policy openai)")
    sampling.add_argument("--temperature", type=float, default=None, metavar="T",
                          help="sampling temperature (default: the server's)")
    sampling.add_argument("--max-tokens", type=positive_int, default=None, metavar="N",
                          help="most tokens per model reply (default: the server's)")
    sampling.add_argument("--seed", type=int, default=None, metavar="S",
                          help="sampling seed: sample i of each task sends seed S+i, so "
                          "the samples differ and a rerun repeats them (servers that "
                          "honour seeds)")
    sampling.add_argument("--extra-body", default=None, metavar="JSON",
                          help="a JSON object merged into every request last, e.g. "
                          "'{\"top_p\": 0.9, \"logprobs\": true}' (or @FILE); logprobs the "
                          "server returns are kept in the results' turn_meta")
    parser.add_argument("--system-prompt", default=None, metavar="TEXT",
                        help="a system message before each task's prompt (any policy); "
                        "@FILE reads it from a file")
    add_run_options(parser, samples_default=1)
    parser.add_argument("--max-steps", type=positive_int, default=None, metavar="N",
                        help="agent steps before an episode is truncated (default 50)")
    parser.add_argument("--task", action="append", default=None, metavar="KEY",
                        dest="task_keys",
                        help="run only this task (repeat for several; default: all)")
    parser.add_argument("--trace", default=None, metavar="NAME",
                        help="upload every episode's transcript to a Fleet trace job of "
                        "this name (on the local Fleet: see `fleetenv serve`); upload "
                        "failures are counted in the summary, never fatal")
    parser.add_argument("--trace-jobs-url", default=None, metavar="URL",
                        help="with --trace: the host that serves Fleet's trace jobs "
                        "(POST /v1/traces/jobs), when it is not FLEET_BASE_URL; uploads "
                        "still go to FLEET_BASE_URL")
    parser.add_argument("--resume", type=Path, default=None, metavar="RESULTS",
                        help="finish the interrupted run of this results file: only the "
                        "episodes (task, sample) it lacks run, appended to it; refused if "
                        "the file's manifest describes another run (see --force)")
    parser.add_argument("--force", action="store_true",
                        help="with --resume: resume even if the task file, policy or "
                        "settings differ from the file's manifest")
    parser.add_argument("--no-preflight", dest="preflight", action="store_false",
                        help="skip the model endpoint and Fleet key checks made before "
                        "anything is provisioned")


def add_run_options(parser: argparse.ArgumentParser, *, samples_default: int) -> None:
    """The options ``run`` and ``demo`` share: samples, workers, results file."""
    parser.add_argument("-n", "--samples", type=positive_int, default=samples_default,
                        metavar="N",
                        help=f"episodes per task (default {samples_default}); pass@k is "
                        "reported for k up to N")
    parser.add_argument("--workers", "--concurrency", dest="workers", type=positive_int,
                        default=8, metavar="K",
                        help="episodes in parallel (default 8); --concurrency is the same")
    parser.add_argument("--out", type=Path, default=None, metavar="PATH",
                        help="results file, one JSON line per episode (default: "
                        "fleetenv-runs/<command>-<time>.jsonl in the current directory)")


def positive_int(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def run(args: argparse.Namespace) -> int:
    from fleetenv.cli.resume import prepare_resume, run_manifest
    from fleetenv.core.config import resolve_config
    from fleetenv.core.task_files import load_tasks
    from fleetenv.core.tasks import select_tasks

    sampling = sampling_from_args(args)
    spec = policy_spec_from_args(args.policy, model=args.model, base_url=args.base_url,
                                 sampling=sampling)
    system_prompt = read_text_option(args.system_prompt, "--system-prompt")
    if args.force and args.resume is None:
        raise ConfigurationError("--force only applies with --resume",
                                 hint="drop --force, or add --resume RESULTS.jsonl")
    traces = trace_options(args.trace, args.trace_jobs_url)
    if args.resume is not None and args.out is not None:
        raise ConfigurationError("--resume appends to its own file; --out does not apply",
                                 hint="drop --out")
    with importable_working_directory():
        # Build it once here: a missing key or a bad import target is one error line now,
        # not the same error in every episode's result.
        policy = spec.build()
    tasks = load_tasks(args.tasks)
    if args.task_keys:
        tasks = select_tasks(tasks, args.task_keys)
    config = resolve_config()
    where = "the embedded local Fleet" if config.use_local else f"Fleet at {config.base_url}"
    manifest = run_manifest(command="run", tasks_file=os.fspath(args.tasks),
                            task_keys=args.task_keys, spec=spec, sampling=sampling,
                            seed=args.seed, samples=args.samples, max_steps=args.max_steps,
                            system_prompt=system_prompt,
                            fleet="local" if config.use_local else config.base_url)
    skip: set[tuple[str, int]] = set()
    if args.resume is not None:
        skip, overridden = prepare_resume(args.resume, manifest, force=args.force)
        if overridden:
            manifest["resume_overrode"] = overridden
            print("note: --force: resuming although " + "; ".join(overridden),
                  file=sys.stderr)
    if args.preflight:
        from fleetenv.cli.preflight import check_model

        check_model(policy)
    todo = len(tasks) * args.samples - len(skip & {(t.key, s) for t in tasks
                                                   for s in range(args.samples)})
    resumed = f", resuming {args.resume} ({todo} left)" if args.resume is not None else ""
    print(f"running {len(tasks)} task(s) x {args.samples} sample(s) with policy "
          f"{spec.describe()} on {where}{resumed}", file=sys.stderr)
    with importable_working_directory():
        results, out = execute(tasks, spec, config=config, samples=args.samples,
                               workers=args.workers, out=args.resume or args.out,
                               max_steps=args.max_steps, command="run", traces=traces,
                               system_prompt=system_prompt, manifest=manifest,
                               resume=args.resume is not None, skip=skip,
                               spec_for_sample=seeded_specs(spec, args.seed),
                               check_fleet=args.preflight, debug=args.debug)
    errors = [r for r in results if r.error]
    if results and len(errors) == len(results):
        first = errors[0].error or {}
        print(f"fleetenv run: every episode failed; the first: {first.get('type')}: "
              f"{first.get('message')}", file=sys.stderr)
        print(f"details per episode are in {out}", file=sys.stderr)
        return 1
    return 0


def trace_options(name: str | None, jobs_url: str | None) -> str | TraceOptions | None:
    """``--trace NAME`` and ``--trace-jobs-url URL`` as the Runner's ``traces=``."""
    from fleetenv.fleet.traces import TraceOptions

    if jobs_url is None:
        return name
    if name is None:
        raise ConfigurationError("--trace-jobs-url only applies with --trace",
                                 hint="add --trace NAME, or drop --trace-jobs-url")
    return TraceOptions(name, jobs_url=jobs_url)


@contextmanager
def importable_working_directory() -> Iterator[None]:
    """Make modules in the current directory importable while the body runs, as
    ``python -m`` does (the ``fleetenv`` script's ``sys.path`` starts with its own
    directory instead), so ``--policy import:mypol:fn`` finds ``./mypol.py``."""
    cwd = os.getcwd()
    added = not any(_same_dir(entry, cwd) for entry in sys.path)
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _same_dir(entry: str, cwd: str) -> bool:
    if entry in ("", "."):
        return True
    try:
        return os.path.samefile(entry, cwd)
    except OSError:
        return False


def sampling_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling settings given on the command line (only those given)."""
    sampling: dict[str, Any] = {}
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    if args.max_tokens is not None:
        sampling["max_tokens"] = args.max_tokens
    if args.extra_body is not None:
        text = read_text_option(args.extra_body, "--extra-body") or ""
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise ConfigurationError(f"--extra-body is not valid JSON: {exc}",
                                     hint="pass a JSON object, e.g. '{\"top_p\": 0.9}', "
                                     "or @FILE") from None
        if not isinstance(body, dict):
            raise ConfigurationError(f"--extra-body must be a JSON object, got "
                                     f"{type(body).__name__}",
                                     hint="e.g. '{\"top_p\": 0.9}'")
        sampling["extra_body"] = body
    return sampling


def read_text_option(value: str | None, flag: str) -> str | None:
    """``TEXT`` as is, ``@FILE`` read from that file."""
    if value is None or not value.startswith("@"):
        return value
    path = Path(value[1:])
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"{flag} {value}: cannot read {path}: {exc.strerror}",
                                 hint=f"pass {flag} TEXT, or @FILE with an existing file"
                                 ) from None


def seeded_specs(spec: PolicySpec, seed: int | None) -> Callable[[int], PolicySpec]:
    """The spec of each sample: with ``--seed S``, sample ``i`` sends seed ``S + i``."""
    if seed is None:
        return lambda sample: spec
    from fleetenv.rollouts.policy_spec import PolicySpec

    return lambda sample: PolicySpec(spec.kind, {**spec.options, "seed": seed + sample})


def policy_spec_from_args(policy: str, *, model: str | None, base_url: str | None,
                          sampling: Mapping[str, Any] | None = None) -> PolicySpec:
    """The picklable policy recipe the command line describes (never holding a key)."""
    from fleetenv.rollouts.policy_spec import PolicySpec, parse_policy_spec

    sampling = dict(sampling or {})
    kind = policy.partition(":")[0]
    if kind == "reference":
        _refuse_openai_options(policy, model, base_url, sampling)
        return PolicySpec("reference")
    if kind == "import":
        _refuse_openai_options(policy, model, base_url, sampling)
        if not policy.partition(":")[2]:
            raise ConfigurationError(f"--policy {policy!r} names nothing to import",
                                     hint="write it as import:package.module:attribute")
        return parse_policy_spec(policy)
    if kind == "openai":
        if not model:
            raise ConfigurationError("--policy openai needs --model",
                                     hint="e.g. --model gpt-4o-mini, or the name your "
                                     "vLLM server serves")
        options: dict[str, Any] = {"model": model, "api_key_env": OPENAI_KEY_ENV, **sampling}
        if base_url:
            options["base_url"] = base_url
        return PolicySpec("openai", options)
    raise ConfigurationError(f"unknown policy {policy!r}",
                             hint="use reference, openai or import:package.module:attribute")


def _refuse_openai_options(policy: str, model: str | None, base_url: str | None,
                           sampling: Mapping[str, Any]) -> None:
    # A --model given to the reference policy is a mistake the user should hear about,
    # not an option silently ignored while they believe a model was evaluated.
    given = [flag for flag, value in (("--model", model), ("--base-url", base_url))
             if value] + ["--" + name.replace("_", "-") for name in sampling]
    if given:
        raise ConfigurationError(f"{', '.join(given)} only apply to --policy openai, "
                                 f"not {policy!r}", hint="drop them, or use --policy openai")


def execute(
    tasks: Sequence[Task],
    spec: PolicySpec,
    *,
    config: FleetConfig,
    samples: int,
    workers: int,
    out: Path | None,
    max_steps: int | None,
    command: str,
    traces: str | TraceOptions | None = None,
    system_prompt: str | None = None,
    manifest: Mapping[str, Any] | None = None,
    resume: bool = False,
    skip: set[tuple[str, int]] | None = None,
    spec_for_sample: Callable[[int], PolicySpec] | None = None,
    check_fleet: bool = False,
    debug: bool = False,
) -> tuple[list[RolloutResult], Path]:
    """Run every task ``samples`` times (less the ``(task key, sample)`` pairs in
    ``skip``), stream results to ``out`` (appending when ``resume``), show the live
    progress, print the summary (and, with ``traces``, upload every episode to that trace
    job). With ``check_fleet``, the Fleet key is checked before anything is provisioned.

    Ctrl-C raises :class:`~fleetenv.cli.interrupts.RunInterrupted` carrying the one line
    to print, after the run's instances were deleted.
    """
    from fleetenv.cli.interrupts import RunInterrupted, quiet_interrupts
    from fleetenv.cli.live import RunDisplay
    from fleetenv.core.events import InstanceDeleted
    from fleetenv.fleet.session import Session
    from fleetenv.rollouts.metrics import summarize
    from fleetenv.rollouts.results import ResultsWriter, read_results
    from fleetenv.rollouts.runner import Runner

    path = out if out is not None else default_results_path(command)
    path.parent.mkdir(parents=True, exist_ok=True)
    skip = skip or set()
    pairs = [(task, sample) for task in tasks for sample in range(samples)
             if (task.key, sample) not in skip]
    results: list[RolloutResult] = []
    started = time.monotonic()
    deleted: set[str] = set()  # for the Ctrl-C line

    def note_deletion(event: Event) -> None:
        if isinstance(event, InstanceDeleted) and event.instance_id:
            deleted.add(event.instance_id)

    display: RunDisplay | None = None
    session: Session | None = None
    runner: Runner | None = None
    with quiet_interrupts(debug=debug):
        try:
            session = Session(config)
            session.events.add_sink(note_deletion)
            if check_fleet:
                from fleetenv.cli.preflight import check_fleet_key

                check_fleet_key(session)
            with ResultsWriter(path, append=resume, manifest=manifest) as writer:
                display = RunDisplay(len(tasks) * samples, done=len(tasks) * samples
                                     - len(pairs))
                with Runner(workers=workers, session=session, max_steps=max_steps,
                            traces=traces, system_prompt=system_prompt,
                            progress=False) as runner:
                    for result in _run_pairs(runner, pairs, spec_for_sample or
                                             (lambda sample: spec), display):
                        writer.write(result)
                        results.append(result)
                        display.finished(failed=result.error is not None,
                                         reward=result.reward)
        except KeyboardInterrupt:
            line = _interrupted_line(command, path, results, runner, deleted, session,
                                     display)
            raise RunInterrupted(line) from None
        finally:
            if display is not None:
                display.close()  # before any line is printed; also after an error
            if session is not None:
                session.close()
    trace_report = runner.trace_report() if runner is not None else None
    elapsed = time.monotonic() - started
    everything = read_results(path) if resume else results
    # pass@1 always, and pass@N when each task ran N > 1 times
    summary = summarize(everything, ks=(1,) if samples <= 1 else (1, samples))
    print(summary.format_table())
    resumed = f" (+{len(everything) - len(results)} from before)" if resume else ""
    print(f"{len(results)} episode(s){resumed} in {elapsed:.1f} s; results: {path}")
    if trace_report is not None:
        print(trace_report.summary())
    return results, path


def _run_pairs(runner: Runner, pairs: Iterable[tuple[Task, int]],
               spec_for_sample: Callable[[int], PolicySpec],
               display: Any) -> Iterable[RolloutResult]:
    """Submit each ``(task, sample)`` (blocking while the runner is full) and yield
    results in the order they finish; every result is handed out in this thread."""
    finished: queue.SimpleQueue[Future[RolloutResult]] = queue.SimpleQueue()
    pending = 0
    for task, sample in pairs:
        future = runner.submit(task, spec_for_sample(sample), sample=sample)
        display.started()
        future.add_done_callback(finished.put)
        pending += 1
        while True:
            try:
                done = finished.get_nowait()
            except queue.Empty:
                break
            pending -= 1
            yield done.result()
    while pending:
        try:
            done = finished.get(timeout=0.25)  # short: Ctrl-C lands between waits
        except queue.Empty:
            continue
        pending -= 1
        yield done.result()


def _interrupted_line(command: str, path: Path, results: Sequence[RolloutResult],
                      runner: Any, deleted: set[str], session: Any, display: Any) -> str:
    """One line: what was stopped, what was deleted, where the partial results are."""
    if runner is None:
        return "interrupted before any episode started; nothing was provisioned"
    left = session.live_instance_ids() if session is not None else []
    # The instances of the episodes Ctrl-C stopped (not those of finished episodes).
    stopped = deleted - {r.instance_id for r in results if r.instance_id}
    running = max(0, (display.submitted if display is not None else 0) - len(results))
    deletions = f"deleted {len(stopped)} instance(s)"
    if left:
        deletions += (f", {len(left)} could not be deleted (`fleetenv sweep --tag "
                      f"{runner.run_tag}` deletes them)")
    resume = f" (finish with --resume {path})" if command == "run" else ""
    return (f"interrupted: stopped {running} running episode(s) and {deletions}; "
            f"{len(results)} finished episode(s) are in {path}{resume}")


def default_results_path(command: str) -> Path:
    """``fleetenv-runs/<command>-<UTC time>.jsonl``: never overwrites an earlier run."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = Path("fleetenv-runs") / f"{command}-{stamp}.jsonl"
    counter = 1
    while path.exists():
        counter += 1
        path = Path("fleetenv-runs") / f"{command}-{stamp}-{counter}.jsonl"
    return path
