"""`ablate export --push-to-hub ORG/NAME`: an exported folder uploaded through huggingface_hub (create_repo,
then upload_folder), for users who have a hub.

No token (HF_TOKEN or `hf auth login`) or offline mode (HF_HUB_OFFLINE) is a SpecError: bad input, exit 2,
the user has to supply something. A hub that cannot be reached or refuses the upload is PushFailed: a
runtime failure, exit 1, since the same command may succeed later. Either way the local folder is complete.
HF_ENDPOINT is read when the push starts (a private hub, or a test's unused port).

May import: config.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ablate.config.errors import SpecError

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class PushFailed(RuntimeError):
    """The hub could not be reached or refused the upload."""


def check_repo_id(repo_id: str) -> str:
    if not REPO_ID.match(repo_id) or ".." in repo_id or repo_id.endswith((".", "-")):
        raise SpecError(
            "not a hub repository id",
            key="--push-to-hub",
            value=repo_id,
            allowed="ORG/NAME (letters, digits, '-', '_', '.')",
        )
    return repo_id


def hub_token(folder: Path, repo_id: str) -> str:
    """The user's hub token; a SpecError saying the folder is complete when there is none."""
    from huggingface_hub import constants, get_token

    later = f"the exported folder {folder} is complete; push it later with `hf upload {repo_id} {folder}`"
    if constants.HF_HUB_OFFLINE:
        raise SpecError(
            f"the hub is in offline mode; {later}",
            key="HF_HUB_OFFLINE",
            value="1",
            allowed="unset HF_HUB_OFFLINE to push",
        )
    token = get_token()
    if not token:
        raise SpecError(
            f"no hub token to push with; {later}",
            key="HF_TOKEN",
            value=None,
            allowed="a token in HF_TOKEN, or `hf auth login`",
        )
    return token


def push_folder(folder: Path, repo_id: str, token: str, message: str) -> str:
    """Create the model repository (kept if it exists) and upload the folder as one commit; its URL."""
    from huggingface_hub import HfApi

    endpoint = os.environ.get("HF_ENDPOINT") or None
    api = HfApi(endpoint=endpoint, token=token)
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id, folder_path=str(folder), repo_type="model", commit_message=message
        )
    except Exception as exc:  # whatever the client raises (connection, HTTP, auth): the push did not happen
        first = (str(exc).strip().splitlines() or [""])[0]
        raise PushFailed(
            f"push to {repo_id} at {endpoint or 'the hub'} failed ({type(exc).__name__}: {first}); "
            f"the exported folder {folder} is complete"
        ) from exc
    return str(getattr(commit, "commit_url", None) or f"{api.endpoint}/{repo_id}")
