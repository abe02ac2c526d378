"""A checkpoint by its Hugging Face repo id: the files its family's export reads, fetched into the hub cache.

`pull(repo_id, revision)` asks the hub (HF_ENDPOINT; huggingface.co by default) for the commit the
revision names and the files it holds, fetches config.json (and model.safetensors.index.json) at
that commit, names the family from config.json (engines/registry.py), then fetches, at the same
commit, only what that family's export opens (its `CHECKPOINT`): of a sharded checkpoint the index
and the shards holding tensors it reads. The rest is huggingface_hub's own: the cache (HF_HOME,
HF_HUB_CACHE) and its resume of a partial file, the token (HF_TOKEN, or the file `huggingface-cli
login` writes), offline mode (HF_HUB_OFFLINE=1). Where the hub cannot be reached, a snapshot in the
cache holding every file the export needs is used, and one line on stderr says so.

Every failure is a `HubError`, one line naming the repository and what to do.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from engines.registry import INDEX, SINGLE, CheckpointFiles, family_of

CONFIG = "config.json"
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
"""owner/name, as the hub spells repository ids ("--" and ".." are refused too)."""
LOGIN = "log in with `huggingface-cli login` or set HF_TOKEN"

if TYPE_CHECKING:
    from huggingface_hub.hf_api import ModelInfo


class HubError(Exception):
    """A checkpoint that cannot be had from the hub; the message is one line."""


def is_repo_id(text: str) -> bool:
    return REPO_ID.fullmatch(text) is not None and "--" not in text and ".." not in text


def pull(repo_id: str, revision: str | None = None, local_dir: Path | None = None) -> Path:
    """The local directory of `repo_id` at `revision` (a branch, tag or commit; default main) holding
    what its family's export reads: fetched into the hub cache (or into `local_dir`), or found there
    when the hub cannot be reached."""
    import requests
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    revision = revision or constants.DEFAULT_REVISION
    try:
        try:
            info = HfApi().model_info(repo_id, revision=revision)
        except (requests.ConnectionError, requests.Timeout, OfflineModeIsEnabled) as exc:
            return _cached(repo_id, revision, local_dir, exc)
        except HfHubHTTPError as exc:
            if exc.response is None or exc.response.status_code < 500:
                raise
            return _cached(repo_id, revision, local_dir, exc)  # the hub (or a mirror) is down
        return _fetch(repo_id, revision, info, local_dir)
    except OSError as exc:  # huggingface_hub's errors are OSErrors (requests'), as are the disk's
        raise HubError(_explain(exc, repo_id, revision)) from exc


def _fetch(repo_id: str, revision: str, info: ModelInfo, local_dir: Path | None) -> Path:
    """config.json and the index first, then what the family's export reads, all at `info.sha`."""
    from huggingface_hub import HfApi, snapshot_download

    commit = info.sha
    if commit is None:
        raise HubError(f"{repo_id}@{revision}: the hub's answer names no commit")
    listing = ({s.rfilename for s in info.siblings} if info.siblings
               else set(HfApi().list_repo_files(repo_id, revision=commit)))
    if CONFIG not in listing:
        raise HubError(f"{repo_id}@{revision}: no {CONFIG}, so not a checkpoint")

    def fetch(names: set[str]) -> Path:
        # exact names as patterns: the listing is the one read above, at the same commit
        return Path(snapshot_download(repo_id, revision=commit, allow_patterns=sorted(names), local_dir=local_dir))

    head = fetch({CONFIG, INDEX} & listing)
    module = family_of(head)
    files: CheckpointFiles = module.CHECKPOINT
    missing = [name for name in files.required if name not in listing]
    if missing:
        raise HubError(f"{repo_id}@{revision}: no {', '.join(missing)}, which the {module.NAME} export reads")
    wanted = {name for name in listing if any(fnmatch.fnmatchcase(name, p) for p in files.required + files.optional)}
    snapshot = fetch(wanted | _weights(head, files, INDEX in listing, SINGLE in listing, f"{repo_id}@{revision}"))
    if local_dir is None and revision != commit:
        _remember(repo_id, revision, commit)
    return snapshot


def _weights(head: Path, files: CheckpointFiles, indexed: bool, single: bool, where: str) -> set[str]:
    """The weight files the export reads: the index and the shards it names for tensors the family
    reads, or model.safetensors."""
    if indexed:
        try:
            weight_map = json.loads((head / INDEX).read_text()).get("weight_map")
        except (json.JSONDecodeError, AttributeError) as exc:
            raise HubError(f"{where}: {INDEX} is not a JSON object ({exc})") from exc
        if not isinstance(weight_map, dict) or not weight_map:
            raise HubError(f"{where}: {INDEX} has no weight_map")
        return {INDEX} | {shard for tensor, shard in weight_map.items() if files.reads(tensor)}
    if single:
        return {SINGLE}
    raise HubError(f"{where}: no {SINGLE} and no {INDEX}")


def _remember(repo_id: str, revision: str, commit: str) -> None:
    """The cache's refs/<revision> names the commit fetched, as huggingface_hub writes it when it
    resolves a branch or tag itself (here every fetch names the commit, so the revision cannot move
    between them): an offline run by branch or tag name finds the snapshot."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    ref = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model") / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)


def _cached(repo_id: str, revision: str, local_dir: Path | None, unreachable: Exception) -> Path:
    """The snapshot of `revision` in the cache (or `local_dir`), if it holds every file the export
    needs (the family's required files and its weights); says so on stderr."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    why, where = _unreachable(unreachable), f"{repo_id}@{revision}"
    forward = (f": pull it where the hub can be reached (edged-engines pull {repo_id}) and copy the cache "
               f"({constants.HF_HUB_CACHE}) here, or export from a checkpoint directory")
    try:
        snapshot = Path(snapshot_download(repo_id, revision=revision, local_dir=local_dir, local_files_only=True))
    except LocalEntryNotFoundError as exc:
        raise HubError(f"{where} is not in the cache ({local_dir or constants.HF_HUB_CACHE}) and {why}{forward}") from exc
    if not (snapshot / CONFIG).is_file():
        raise HubError(f"{where}: the cached snapshot {snapshot} has no {CONFIG} and {why}{forward}")
    files: CheckpointFiles = family_of(snapshot).CHECKPOINT
    needed = set(files.required)
    if (snapshot / INDEX).is_file():
        needed |= _weights(snapshot, files, True, False, where)
    else:
        needed.add(SINGLE)
    missing = sorted(name for name in needed if not (snapshot / name).is_file())
    if missing:
        raise HubError(f"{where}: the cached snapshot {snapshot} lacks {', '.join(missing)} and {why}{forward}")
    print(f"edged-engines: {where}: {why}; using the cached snapshot {snapshot}", file=sys.stderr)
    return snapshot


def _unreachable(exc: Exception) -> str:
    from huggingface_hub import constants
    from huggingface_hub.errors import OfflineModeIsEnabled

    if isinstance(exc, OfflineModeIsEnabled):
        return "the hub was not asked (HF_HUB_OFFLINE=1)"
    return f"the hub cannot be reached ({constants.ENDPOINT}: {_reason(exc)})"


def _explain(exc: OSError, repo_id: str, revision: str) -> str:
    """One line for a failed pull: what went wrong and what to do about it."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint, where = constants.ENDPOINT, f"{repo_id}@{revision}"
    token = get_token() is not None
    if isinstance(exc, GatedRepoError):
        if token:
            return f"{repo_id} is gated and the token sent has no access: accept its conditions at {endpoint}/{repo_id}"
        return f"{repo_id} is gated: accept its conditions at {endpoint}/{repo_id}, then {LOGIN}"
    if isinstance(exc, RepositoryNotFoundError):
        if token:
            return f"{repo_id}: no such repository on {endpoint}, or the token sent cannot read it"
        return f"{repo_id}: no such repository on {endpoint}, or it is private or gated ({LOGIN})"
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo_id} has no revision {revision!r} (a branch, tag or commit)"
    if isinstance(exc, LocalEntryNotFoundError):  # the hub went away between files (before EntryNotFoundError, its base)
        cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
        return f"{where}: the hub could not be reached ({_unreachable(cause)}); run the command again to resume"
    if isinstance(exc, EntryNotFoundError):
        return f"{where}: a file it lists is not there ({_reason(exc)})"
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        if exc.response.status_code == 401:  # the hub's answer to a token it does not know
            return f"{where}: {endpoint} does not know the token sent (401 Unauthorized): {LOGIN}"
        return f"{where}: {endpoint} answered {exc.response.status_code} {exc.response.reason}"
    import requests

    if isinstance(exc, requests.RequestException):  # a download cut off: huggingface_hub keeps the partial file
        return f"{where}: the download broke off ({_reason(exc)}); run the command again to resume it"
    return f"{where}: {_reason(exc)}"


GIST = re.compile(r"\[Errno -?\d+\] [^'\")]+|Connection broken: [^'\"]+")
"""What a connection error says under its wrappers: the system's words, or urllib3's."""


def _reason(exc: BaseException) -> str:
    """The gist of an error in one line: [Errno 111] Connection refused, Connection broken:
    IncompleteRead(...), else the message's first line."""
    text = str(exc)
    found = GIST.search(text)
    if found:
        return found.group(0).strip()
    return (text.strip().splitlines() or [type(exc).__name__])[0]
