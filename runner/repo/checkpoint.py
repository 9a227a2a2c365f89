"""The checkpoint of a passed phase, made so that an interrupt or a kill never half-makes it.

``make_checkpoint`` publishes a phase's checkpoint in this order:

1. Refuse before anything is written (``preflight``): a signed-tag configuration
   (``tag.gpgSign``), a stale ``index.lock``, a tag name git would not accept, an existing tag
   of that name, ``HEAD`` or the branch moved since the gates started (``expected_head``), the
   plan file deleted, or its bytes changed by someone while the gates ran in a way the
   caller's ``plan_text`` cannot merge.
2. Build every object without touching the user's index or work tree: the new plan text is
   hashed as a blob (``hash-object -w --stdin``), the tree is built in a private index
   (``GIT_INDEX_FILE``), then ``commit-tree`` and an annotated tag object (``mktag``). These
   objects are unreachable until step 3; a kill before it leaves the repository as it was.
3. Publish branch and tag in one ``update-ref --stdin`` transaction: the branch is moved only
   if it still names ``expected_head`` (compare-and-swap) and the tag is only created (never
   moved, never ``-f``). Both change or neither does.
4. Reset the user's real index entries of the committed paths to the new commit (every other
   staged change stays staged), then write the plan into the work tree by an atomic rename.

Steps 2 to 4 run with SIGINT and SIGTERM blocked (``signal.pthread_sigmask``), so Ctrl-C or
SIGTERM during them takes effect once the checkpoint is complete; the git processes started
meanwhile inherit the mask and are not ended by a Ctrl-C sent to the terminal's process group.
A SIGKILL cannot be deferred: killed after step 3 the repository holds a complete, tagged
commit whose plan the work tree and index may not show yet. ``recover`` (call it at the start
of every ``advance``, under the lock) finishes that, tags a checkpoint commit left without its
tag by an older runner, and reports a plan that claims a phase complete without its tag.

Text that goes into the commit and tag messages is reduced to one line each
(``one_line``), so a host name or gate name with a newline cannot forge a trailer.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from runner.atomic import leftover_temps, write_atomic_bytes
from runner.errors import GitError
from runner.formatting import one_line
from runner.repo.git import (
    blob,
    check_tag_name,
    config_value,
    current_branch,
    git_dir,
    git_output,
    rev,
    run_git,
)
from runner.repo.lock import pid_alive

TRAILER_KEYS = ("Runner-Plan", "Runner-Phase", "Runner-Fingerprint", "Runner-Machine", "Runner-Gates")

# Fault injection for tests: called with the name of each step as it starts.
FaultHook = Callable[[str], None]
_fault_hook: FaultHook | None = None
STEPS = ("preflight", "blob", "tree", "commit", "tag-object", "publish", "index", "worktree", "done")


def set_fault_hook(hook: FaultHook | None) -> None:
    """Install ``hook`` (called with each step's name from ``STEPS``); ``None`` removes it."""
    global _fault_hook
    _fault_hook = hook


def _step(name: str) -> None:
    if _fault_hook is not None:
        _fault_hook(name)


# --- message text ---------------------------------------------------------------------------


def commit_message(
    plan_id: str,
    phase_id: str,
    fingerprint: str,
    machine_fingerprint: str,
    where: str,
    hostname: str,
    gates: Sequence[tuple[str, str]],
    metrics: Mapping[str, str],
) -> str:
    """``<plan>/<phase>: checkpoint (build PASS, ...)``, headline metrics, then the trailers.

    ``gates`` are ``(name, outcome)`` pairs, ``metrics`` name -> text. Every value is passed
    through ``one_line``; a metric line that would read as a ``Runner-`` trailer is prefixed
    with ``metric`` so the trailer block is only ever the last paragraph.
    """
    summary = ", ".join(f"{one_line(name)} {one_line(outcome)}" for name, outcome in gates)
    lines = [f"{one_line(plan_id)}/{one_line(phase_id)}: checkpoint ({summary})", ""]
    if metrics:
        for name, value in metrics.items():
            line = f"{one_line(name)}: {one_line(value)}"
            if line.lower().startswith("runner-"):
                line = "metric " + line
            lines.append(line)
        lines.append("")
    lines += [
        f"Runner-Plan: {one_line(plan_id)}",
        f"Runner-Phase: {one_line(phase_id)}",
        f"Runner-Fingerprint: {one_line(fingerprint)}",
        f"Runner-Machine: {one_line(machine_fingerprint)} ({one_line(where)}, {one_line(hostname)})",
        f"Runner-Gates: {', '.join(f'{one_line(n)}={one_line(o)}' for n, o in gates)}",
    ]
    return "\n".join(lines) + "\n"


def parse_trailers(message: str) -> dict[str, str]:
    """The ``Runner-*`` trailers of the last paragraph of ``message`` (first of each key)."""
    paragraphs = [part for part in message.strip("\n").split("\n\n") if part.strip()]
    if not paragraphs:
        return {}
    found: dict[str, str] = {}
    for line in paragraphs[-1].splitlines():
        key, sep, value = line.partition(": ")
        if sep and key in TRAILER_KEYS and key not in found:
            found[key] = value
    return found


# --- preflight ------------------------------------------------------------------------------


def preflight(root: Path, *, tag: str, expected_head: str, expected_branch: str | None = None) -> None:
    """Raise ``GitError`` naming what to do unless a checkpoint tagged ``tag`` can land on
    ``expected_head`` now. Changes nothing."""
    root = Path(root)
    check_tag_name(root, tag)
    if (config_value(root, "tag.gpgSign") or "").lower() in ("true", "yes", "on", "1"):
        raise GitError(
            "tag.gpgSign is true: the runner cannot sign its checkpoint tags unattended; "
            "set it for this repository with git config tag.gpgSign false"
        )
    lock = git_dir(root) / "index.lock"
    if lock.exists():
        raise GitError(
            f"{lock} exists: another git command is running, or one crashed and left it; "
            "when no git command is running, remove it (rm .git/index.lock)"
        )
    existing = rev(root, f"refs/tags/{tag}")
    if existing is not None:
        raise GitError(
            f"tag {tag} already exists (at {existing[:12]}); the runner never moves a tag. "
            f"Delete it (git tag -d {tag}) if the phase is to be checkpointed again"
        )
    branch = current_branch(root)
    if branch is None:
        raise GitError("HEAD is detached; check out a branch so the checkpoint lands on it")
    if expected_branch is not None and branch != expected_branch:
        raise GitError(
            f"the branch changed while the gates ran ({expected_branch} -> {branch}); "
            "nothing was committed: switch back and run advance again"
        )
    head = rev(root, "HEAD^{commit}")
    if head != expected_head:
        raise GitError(
            f"HEAD moved while the gates ran ({expected_head[:12]} -> {(head or 'none')[:12]}); "
            "the gates did not run on this commit, so nothing was committed: run advance again"
        )


# --- signals --------------------------------------------------------------------------------


@contextmanager
def deferred_signals(signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Hold back ``signals`` for the block; one that arrives meanwhile is delivered (to the
    handler that was installed before) when the block ends.

    Two layers, because a process-directed signal may be delivered to any thread that does not
    block it: the main thread blocks them (so child processes started in the block inherit the
    mask and a Ctrl-C to the terminal's process group does not end them), and their Python
    handlers are replaced by one that only records them. Only in the main thread (Python runs
    handlers and allows ``signal.signal`` there); elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = list(signals)
    pending: list[int] = []

    def record(signum: int, _frame: object) -> None:
        if signum not in pending:
            pending.append(signum)

    previous = {}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    try:
        for signum in wanted:
            previous[signum] = signal.signal(signum, record)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)  # a blocked one is delivered here
        for signum in pending:
            signal.raise_signal(signum)


# --- the checkpoint -------------------------------------------------------------------------


def make_checkpoint(
    root: Path,
    *,
    plan_rel: str,
    plan_before: bytes,
    plan_text: Callable[[bytes], str],
    paths: Sequence[str],
    tested: Mapping[str, str],
    message: str,
    tag: str,
    tag_message: str,
    expected_head: str,
    expected_branch: str | None = None,
    evidence: Sequence[str] = (),
    notes: list[str] | None = None,
) -> str:
    """Commit ``plan_rel`` (as ``plan_text`` renders it), ``paths`` and ``evidence`` (as they are
    in the work tree) on ``expected_head``, tag it ``tag`` and return the commit's sha (module
    docstring).

    ``tested`` maps every file of the tree the gates ran on to the sha256 (hex) of its content
    (``TreeState.files``). What ``paths`` contribute to the commit must be exactly that: a file
    under them that changed, appeared or vanished after the tree was fingerprinted (an edit
    after the gates' last fingerprint, a hook) is refused (``GitError``, nothing changed).
    ``evidence`` (the run's report folder, written by the runner itself) is committed as is.

    ``plan_before`` is the plan's bytes when the gates started. ``plan_text(current_bytes)``
    returns the new plan text; it is called with the plan's bytes as they are now, so when
    someone edited the plan meanwhile it must merge the status into those bytes (re-parse and
    re-render) or raise to refuse. ``GitError`` for every refusal; nothing was changed then.
    Once branch and tag are published nothing is raised: a problem updating the index (an
    ``index.lock`` taken meanwhile) is a line appended to ``notes`` (when given), and the plan
    is still written.
    """
    root = Path(root)
    _step("preflight")
    plan_path = root / plan_rel
    try:
        current = plan_path.read_bytes()
    except FileNotFoundError:
        raise GitError(
            f"the plan {plan_rel} was deleted while the gates ran; nothing was committed "
            f"(restore it with git checkout -- {plan_rel})"
        ) from None
    preflight(root, tag=tag, expected_head=expected_head, expected_branch=expected_branch)
    real = Path(os.path.realpath(plan_path))
    try:  # a plan that is a symbolic link: its target is what changes and is committed
        commit_rel = real.relative_to(Path(os.path.realpath(root))).as_posix()
    except ValueError:
        raise GitError(
            f"the plan {plan_rel} is a symbolic link to {real}, outside the repository; the "
            "checkpoint could not commit it: keep the plan inside the repository"
        ) from None
    try:
        new_text = plan_text(current)
    except Exception as exc:  # noqa: BLE001 - reported as a refusal
        edited = " (it was edited while the gates ran)" if current != plan_before else ""
        raise GitError(f"cannot record the checkpoint in {plan_rel}{edited}: {exc}") from exc
    new_bytes = new_text.encode("utf-8")
    branch = expected_branch or current_branch(root) or ""
    checked = list(dict.fromkeys(p for p in (str(p) for p in paths) if p not in (plan_rel, commit_rel)))
    unchecked = [p for p in dict.fromkeys(str(p) for p in evidence) if p not in (plan_rel, commit_rel, *checked)]
    other = checked + unchecked
    folder = git_dir(root)
    stamp = f"{os.getpid()}-{uuid.uuid4().hex}"
    index = folder / f"runner-index-{stamp}"
    scratch = {"GIT_INDEX_FILE": str(index)}
    with deferred_signals():
        try:
            _step("blob")
            plan_blob = git_output(root, "hash-object", "-w", "--stdin", input=new_bytes)
            _step("tree")
            run_git(root, "read-tree", expected_head, env=scratch)
            if other:
                run_git(root, "add", "-A", "--", *other, env=scratch)
            untested = _untested(root, scratch, expected_head, checked, tested, skip=[commit_rel, *unchecked])
            if untested:
                raise GitError(
                    "the tree changed after the gates' last fingerprint, so the commit would hold "
                    f"what they did not test ({'; '.join(untested[:10])}); nothing was committed: "
                    "run advance again on a tree that nobody edits meanwhile"
                )
            mode = _plan_mode(root, plan_path)
            run_git(root, "update-index", "--add", "--cacheinfo", f"{mode},{plan_blob},{commit_rel}", env=scratch)
            tree = git_output(root, "write-tree", env=scratch)
        finally:
            for path in (index, index.with_name(index.name + ".lock")):
                path.unlink(missing_ok=True)
        _step("commit")
        new = git_output(root, "commit-tree", tree, "-p", expected_head, input=_with_newline(message).encode())
        _step("tag-object")
        tagger = git_output(root, "var", "GIT_COMMITTER_IDENT")
        tag_body = (
            f"object {new}\ntype commit\ntag {tag}\ntagger {tagger}\n\n{_with_newline(one_line(tag_message))}"
        )
        tag_obj = git_output(root, "mktag", input=tag_body.encode())
        _step("publish")
        transaction = (
            f"start\nupdate {branch} {new} {expected_head}\ncreate refs/tags/{tag} {tag_obj}\n"
            "prepare\ncommit\n"
        )
        try:
            run_git(root, "update-ref", "--stdin", "-m", f"runner checkpoint {tag}", input=transaction.encode())
        except GitError as exc:
            raise GitError(f"the checkpoint commit failed, nothing was changed (the plan was left as it was): {exc}") from exc
        _step("index")
        committed = [commit_rel, *other]
        try:
            _reset_index(root, new, committed)
        except GitError as exc:  # e.g. an index.lock taken meanwhile: the checkpoint stands
            if notes is not None:
                notes.append(
                    f"checkpoint {new[:12]} is committed and tagged {tag}, but the index entries of its "
                    f"paths could not be updated ({exc}); the next advance updates them, or run "
                    "git reset -q -- <paths>"
                )
        _step("worktree")
        write_atomic_bytes(plan_path, new_bytes)
        _step("done")
    return new


def _untested(
    root: Path, scratch: Mapping[str, str], base: str, paths: Sequence[str], tested: Mapping[str, str],
    *, skip: Sequence[str],
) -> list[str]:
    """How the entries under ``paths`` in the private index differ from the tested tree: a file
    whose content is not the tested one, a file the fingerprint did not see that differs from
    ``base`` (created afterwards), a tested file that is gone. Submodules and ``skip`` (the plan,
    the run's own report) are not compared."""
    if not paths:
        return []

    def under(rel: str, folders: Sequence[str]) -> bool:
        return any(f in (".", "") or rel == f or rel.startswith(f.rstrip("/") + "/") for f in folders)

    staged = _entries(git_output(root, "ls-files", "-s", "-z", "--", *paths, env=scratch), stage=True)
    before = _entries(git_output(root, "ls-tree", "-r", "-z", base, "--", *paths), stage=False)
    staged = {rel: entry for rel, entry in staged.items() if not under(rel, skip) and entry[0] != "160000"}
    digests = _blob_digests(root, {oid for _, oid in staged.values()})
    problems = []
    for rel, (mode, oid) in sorted(staged.items()):
        if rel in tested:
            if digests.get(oid) != tested[rel]:
                problems.append(f"{rel} changed")
        elif (mode, oid) != before.get(rel):
            problems.append(f"{rel} is not in the tested tree")
    problems += [f"{rel} was removed" for rel in sorted(tested) if under(rel, paths) and not under(rel, skip)
                 and rel not in staged]
    return problems


def _entries(listing: str, *, stage: bool) -> dict[str, tuple[str, str]]:
    """``path -> (mode, object id)`` from ``ls-files -s -z`` (``stage``) or ``ls-tree -r -z``."""
    found = {}
    for record in filter(None, listing.split("\0")):
        meta, _, rel = record.partition("\t")
        fields = meta.split()
        found[rel] = (fields[0], fields[1] if stage else fields[2])
    return found


def _blob_digests(root: Path, oids: Iterable[str]) -> dict[str, str]:
    """The sha256 (hex) of each blob's content, read in one ``cat-file --batch``."""
    wanted = sorted(oids)
    if not wanted:
        return {}
    data = run_git(root, "cat-file", "--batch", input=("\n".join(wanted) + "\n").encode()).stdout
    digests, cursor = {}, 0
    for oid in wanted:
        header_end = data.index(b"\n", cursor)
        _, kind, size = data[cursor:header_end].decode().split()
        start = header_end + 1
        digests[oid] = hashlib.sha256(data[start : start + int(size)]).hexdigest()
        cursor = start + int(size) + 1
    return digests


def _plan_mode(root: Path, plan_path: Path) -> str:
    try:
        executable = os.stat(plan_path).st_mode & 0o111
    except OSError:
        executable = 0
    return "100755" if executable else "100644"


def _reset_index(root: Path, commit: str, paths: Sequence[str]) -> None:
    try:
        run_git(root, "reset", "-q", commit, "--", *paths)
    except GitError as exc:
        raise GitError(
            f"checkpoint {commit[:12]} was committed and tagged, but the index could not be "
            f"updated for its paths ({exc}); run advance again to finish it"
        ) from exc


def _with_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


# --- recovery -------------------------------------------------------------------------------


@dataclass
class Recovery:
    """What ``recover`` found: ``repaired`` lines say what it finished, ``problems`` what it
    could not (the caller should refuse to advance and show them)."""

    repaired: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def recover(root: Path, *, plan_rel: str, complete_tags: Iterable[str] = ()) -> Recovery:
    """Finish or report a checkpoint that a killed runner left half made.

    * ``HEAD`` is a checkpoint commit (``Runner-Plan``/``Runner-Phase`` trailers) without its
      tag: the tag is created (reported as a problem if the name is taken by another commit).
    * ``HEAD`` is a checkpoint commit whose plan differs from the work tree's, and the work
      tree still holds the parent's plan bytes: the plan is written and the index entries of
      the commit's paths that still hold the parent's version are reset. A work-tree plan
      that differs from both is someone's later edit, and a tag naming another commit a
      rebased checkpoint: neither is touched.
    * ``complete_tags``: the tags of the phases the work-tree plan marks ``complete``; one
      that does not exist is reported (the plan claims a checkpoint that was never made).
    * Scratch index files of dead runners under the git dir are removed.

    Call it under the repository lock, before choosing the next phase.
    """
    root = Path(root)
    found = Recovery()
    folder = git_dir(root)
    for scratch in folder.glob("runner-index-*"):
        pid = scratch.name.removeprefix("runner-index-").split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            scratch.unlink(missing_ok=True)
    for temp, pid in leftover_temps(root / plan_rel):
        if not pid_alive(pid):
            temp.unlink(missing_ok=True)
    head = rev(root, "HEAD^{commit}")
    if head is not None:
        raw = run_git(root, "cat-file", "commit", head).stdout.decode("utf-8", "replace")
        trailers = parse_trailers(raw.partition("\n\n")[2])
        if "Runner-Plan" in trailers and "Runner-Phase" in trailers:
            _recover_head(root, head, raw, trailers, plan_rel, found)
    for tag in complete_tags:
        if rev(root, f"refs/tags/{tag}") is None:
            found.problems.append(
                f"the plan marks the phase of tag {tag} complete, but there is no such tag: its "
                f"checkpoint was never made. Restore the plan (git checkout HEAD -- {plan_rel}) "
                "or set the phase's status back to pending, then run advance again"
            )
    return found


def _recover_head(
    root: Path, head: str, raw: str, trailers: dict[str, str], plan_rel: str, found: Recovery
) -> None:
    """Only the states a checkpoint passes through are touched: the work-tree plan equal to
    the committed one (a tag may be missing) or to the parent's (not written yet). A plan
    someone edited since, or a tag that names another commit (a rebased checkpoint), is
    history, not a half-made checkpoint: left alone."""
    tag = f"{trailers['Runner-Plan']}/{trailers['Runner-Phase']}"
    parent = rev(root, f"{head}^1")
    committed = blob(root, head, plan_rel)
    if committed is None:
        return
    try:
        work: bytes | None = (root / plan_rel).read_bytes()
    except FileNotFoundError:
        work = None
    before = blob(root, parent, plan_rel) if parent else None
    if work != committed and work != before:
        return
    tagged = rev(root, f"refs/tags/{tag}^{{commit}}")
    if tagged is not None and tagged != head:
        return
    if tagged is None:
        try:
            check_tag_name(root, tag)
            subject = raw.partition("\n\n")[2].split("\n", 1)[0]
            run_git(root, "tag", "-a", "--cleanup=verbatim", "-m", one_line(subject), tag, head)
            found.repaired.append(f"tagged checkpoint {head[:12]} {tag} (its tag was missing)")
        except GitError as exc:
            found.problems.append(f"checkpoint {head[:12]} has no tag {tag} and it could not be made: {exc}")
            return
    if work != committed:
        write_atomic_bytes(root / plan_rel, committed)
        found.repaired.append(f"wrote {plan_rel} as checkpoint {head[:12]} ({tag}) committed it")
    if parent is None:
        return
    changed = git_output(root, "diff-tree", "-r", "--name-only", "--no-renames", "-z", parent, head).split("\0")
    stale = [rel for rel in filter(None, changed) if _index_entry(root, rel) == _tree_entry(root, parent, rel)]
    if stale:
        _reset_index(root, head, stale)
        found.repaired.append(f"reset the index entries of {len(stale)} path(s) to checkpoint {head[:12]}")


def _index_entry(root: Path, rel: str) -> str | None:
    out = git_output(root, "ls-files", "-s", "--", rel)
    return out.split()[1] if out and "\n" not in out else None


def _tree_entry(root: Path, revision: str, rel: str) -> str | None:
    out = git_output(root, "ls-tree", revision, "--", rel)
    return out.split()[2] if out and "\n" not in out else None


# --- plan helpers for the caller --------------------------------------------------------------


def plan_renderer(
    plan_path: Path, updates: Mapping[str, object], before: object | None = None
) -> Callable[[bytes], str]:
    """A ``plan_text`` for ``make_checkpoint``: parse the plan's current bytes and apply
    ``updates`` (phase id -> ``PhaseUpdate``) to them, so edits made to the plan while the gates
    ran are kept; a plan that no longer parses, or lost the phase, raises (a refusal). With
    ``before`` (the ``PlanDocument`` the gates ran from), a phase whose ``gates`` or ``paths``
    were edited meanwhile also raises: its gates are not the ones that passed."""
    from runner.plan.load import decode_plan_bytes, parse_plan, plan_format
    from runner.plan.rewrite import render_updates

    path = Path(plan_path)

    def definition(doc: object, phase_id: str) -> object:
        for phase in doc.plan.phases:  # type: ignore[attr-defined]
            if phase.id == phase_id:
                return phase.model_dump(include={"gates", "paths"})
        return None

    def render(data: bytes) -> str:
        doc = parse_plan(decode_plan_bytes(data, path), path=path, format=plan_format(path))
        if before is not None:
            for phase_id in updates:
                if definition(doc, phase_id) != definition(before, phase_id):
                    raise ValueError(
                        f"the gates or paths of phase {phase_id} were edited while its gates ran; "
                        "run advance again so the edited gates are the ones checked"
                    )
        return render_updates(doc, dict(updates))

    return render


def uncommitted_complete_tags(root: Path, plan_rel: str) -> list[str]:
    """The checkpoint tags of the phases the work-tree plan marks ``complete`` while the plan
    committed at ``HEAD`` does not (what ``recover`` checks with ``complete_tags``). Empty when
    either plan cannot be read or parsed (the normal plan checks report that)."""
    from runner.errors import PlanError
    from runner.plan.load import decode_plan_bytes, parse_plan, plan_format

    root = Path(root)
    path = root / plan_rel

    def complete(data: bytes) -> dict[str, str]:
        doc = parse_plan(decode_plan_bytes(data, path), path=path, format=plan_format(path))
        return {
            phase.id: phase.checkpoint.tag
            for phase in doc.plan.phases
            if phase.status == "complete" and phase.checkpoint is not None
        }

    try:
        work = complete(path.read_bytes())
        committed_bytes = blob(root, "HEAD", plan_rel)
        committed = complete(committed_bytes) if committed_bytes is not None else {}
    except (OSError, PlanError, GitError):
        return []
    return [tag for phase_id, tag in work.items() if phase_id not in committed]
