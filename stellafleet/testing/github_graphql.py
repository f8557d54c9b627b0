"""The GraphQL half of the local GitHub API server (/api/graphql)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

from stellafleet.testing.github_rest import Reply
from stellafleet.testing.github_state import GitHubState, MergeConflict, PullRequest, Repository
from stellafleet.testing.graphql_select import select

LOGIN = "stella-bot"
_OPERATION = re.compile(r"\b(query|mutation)\s+(\w+)")


def operation_name(body: bytes) -> str:
    """`query NAME` or `mutation NAME` of a GraphQL request body ("" when it has none)."""
    try:
        match = _OPERATION.search(str(json.loads(body or b"{}").get("query") or ""))
    except (ValueError, AttributeError):
        return ""
    return f"{match.group(1)} {match.group(2)}" if match else ""


def answer_graphql(state: GitHubState, body: bytes, base: str) -> Reply:
    data = json.loads(body or b"{}")
    query = str(data.get("query") or "")
    variables: dict[str, Any] = data.get("variables") or {}
    match = _OPERATION.search(query)
    name = match.group(2) if match else ""
    handler = _HANDLERS.get(name) or (_type_fields if "__type(" in query else None)
    if handler is _type_fields:
        variables = {"query": query}
    if handler is None:
        sys.stderr.write(f"GQL? {json.dumps(data)[:4000]}\n")
        return Reply.json(200, {"data": None, "errors": [{"message": f"unknown operation {name!r}"}]})
    try:
        with state.lock:
            return Reply.json(200, {"data": select(handler(state, variables, base), query)})
    except GraphQLError as exc:
        error: dict[str, Any] = {"type": exc.kind, "message": str(exc)}
        if exc.path:
            error["path"] = list(exc.path)
        return Reply.json(200, {"data": None, "errors": [error]})


class GraphQLError(Exception):
    """An answer of GraphQL errors (HTTP 200, as GitHub sends them): a message, a type, the field's path."""

    def __init__(self, message: str, *, kind: str = "UNPROCESSABLE", path: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.kind = kind
        self.path = path


Vars = dict[str, Any]


def _viewer(state: GitHubState, variables: Vars, base: str) -> dict[str, Any]:
    return {"viewer": {"login": LOGIN}}


def _repo_of(state: GitHubState, variables: Vars) -> Repository:
    owner, name = str(variables.get("owner")), str(variables.get("repo") or variables.get("name"))
    repo = state.repo(owner, name)
    if repo is None:
        raise GraphQLError(
            f"Could not resolve to a Repository with the name '{owner}/{name}'.",
            kind="NOT_FOUND",
            path=("repository",),
        )
    return repo


def pr_node(state: GitHubState, repo: Repository, pr: PullRequest, base: str) -> dict[str, Any]:
    """A pull request with every field gh's queries ask for (gh ignores what it did not ask)."""
    url = f"{base}/{repo.full_name}/pull/{pr.number}"
    head_sha = repo.refs().get(f"refs/heads/{pr.head}", "")
    return {
        "id": pr.node_id,
        "number": pr.number,
        "url": url,
        "title": pr.title,
        "body": pr.body,
        "state": pr.state,
        "closed": pr.state != "OPEN",
        "isDraft": False,
        "locked": False,
        "headRefName": pr.head,
        "baseRefName": pr.base,
        "headRefOid": head_sha,
        "headRepository": {"id": "R_kgDOtest", "name": repo.name},
        "headRepositoryOwner": {"id": "O_test", "login": repo.owner},
        "isCrossRepository": False,
        "maintainerCanModify": False,
        "createdAt": pr.created_at,
        "updatedAt": pr.updated_at,
        "mergedAt": pr.merged_at,
        "closedAt": pr.closed_at,
        "mergeCommit": {"oid": pr.merge_commit} if pr.merge_commit else None,
        "mergeable": "MERGEABLE" if pr.state == "OPEN" else "UNKNOWN",
        "mergeStateStatus": "CLEAN" if pr.state == "OPEN" else "UNKNOWN",
        "isInMergeQueue": pr.queued_at is not None,
        "isMergeQueueEnabled": repo.merge_queue,
        "mergeQueueEntry": None,
        "author": {"login": LOGIN, "__typename": "User"},
        "additions": 1,
        "deletions": 0,
        "changedFiles": 1,
        "assignees": {"nodes": [], "totalCount": 0},
        "labels": {"nodes": [], "totalCount": 0},
        "projectCards": {"nodes": [], "totalCount": 0},
        "projectItems": {"nodes": [], "totalCount": 0},
        "milestone": None,
        "reviewRequests": {"nodes": [], "totalCount": 0},
        "reviews": {"nodes": [], "totalCount": 0},
        "latestReviews": {"nodes": [], "totalCount": 0},
        "comments": {"nodes": [], "totalCount": 0},
        "commits": {"nodes": [], "totalCount": 1},
        "files": {"nodes": [], "totalCount": 0},
        "statusCheckRollup": {"nodes": []},
        "reviewDecision": "",
        "autoMergeRequest": None
        if pr.queued_at is None
        else {"enabledAt": pr.updated_at, "mergeMethod": repo.merge_queue_method},
        "viewerCanEditFiles": True,
        "potentialMergeCommit": None,
        "repository": {"nameWithOwner": repo.full_name},
    }


def _connection(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"totalCount": len(nodes), "nodes": nodes, "pageInfo": {"hasNextPage": False, "endCursor": ""}}


def _pr_list(state: GitHubState, variables: Vars, base: str) -> dict[str, Any]:
    repo = _repo_of(state, variables)
    states = set(variables.get("state") or variables.get("states") or ["OPEN", "CLOSED", "MERGED"])
    head = variables.get("headBranch") or variables.get("headRefName")
    into = variables.get("baseBranch")
    found = [
        pr
        for pr in reversed(repo.prs)
        if pr.state in states and (head is None or pr.head == head) and (into is None or pr.base == into)
    ][: int(variables.get("limit") or 30)]
    nodes = [pr_node(state, repo, pr, base) for pr in found]
    default = {"name": repo.default_branch}
    return {"repository": {"pullRequests": _connection(nodes), "defaultBranchRef": default}}


def repo_node(repo: Repository, base: str) -> dict[str, Any]:
    return {
        "id": "R_kgDOtest",
        "databaseId": 1,
        "name": repo.name,
        "nameWithOwner": repo.full_name,
        "owner": {"login": repo.owner},
        "url": f"{base}/{repo.full_name}",
        "sshUrl": f"git@{base.split('//', 1)[1]}:{repo.full_name}.git",
        "hasIssuesEnabled": True,
        "hasWikiEnabled": False,
        "description": "",
        "viewerPermission": "ADMIN",
        "defaultBranchRef": {"name": repo.default_branch},
        "parent": None,
        "mergeCommitAllowed": True,
        "rebaseMergeAllowed": True,
        "squashMergeAllowed": True,
        "isPrivate": True,
        "isArchived": False,
    }


def _repo_info(state: GitHubState, variables: Vars, base: str) -> dict[str, Any]:
    return {"repository": repo_node(_repo_of(state, variables), base)}


def _repo_of_pr(state: GitHubState, node_id: str) -> tuple[Repository, PullRequest]:
    for repo in state.repos.values():
        for pr in repo.prs:
            if pr.node_id == node_id:
                return repo, pr
    raise GraphQLError(f"Could not resolve to a node with the global id of '{node_id}'", kind="NOT_FOUND")


def _pr_create(state: GitHubState, variables: Vars, base: str) -> dict[str, Any]:
    given = variables.get("input") or {}
    repo = next((r for r in state.repos.values() if given.get("repositoryId") in ("R_kgDOtest", None)), None)
    if repo is None:
        raise GraphQLError("Could not resolve to a Repository")
    head, into = str(given.get("headRefName")), str(given.get("baseRefName"))
    refs = repo.refs()
    if f"refs/heads/{head}" not in refs:
        raise GraphQLError(
            f"Head sha can't be blank, Base sha can't be blank, Head ref must be a branch ({head})"
        )
    if repo.open_pr(head) is not None:
        raise GraphQLError(f"A pull request already exists for {repo.owner}:{head}.")
    if refs.get(f"refs/heads/{into}") == refs[f"refs/heads/{head}"]:
        raise GraphQLError(f"No commits between {into} and {head}")
    now = state.iso()
    number = max([0, *(pr.number for pr in repo.prs)]) + 1
    pr = PullRequest(
        number, head, into, str(given.get("title") or ""), str(given.get("body") or ""), now, now
    )
    repo.prs.append(pr)
    return {"createPullRequest": {"pullRequest": pr_node(state, repo, pr, base)}}


def _pr_by_number(state: GitHubState, variables: Vars, base: str) -> dict[str, Any]:
    repo = _repo_of(state, variables)
    number = int(variables.get("pr_number") or variables.get("number") or 0)
    pr = repo.pr(number)
    if pr is None:
        raise GraphQLError(
            f"Could not resolve to a PullRequest with the number of {number}.",
            kind="NOT_FOUND",
            path=("repository", "pullRequest"),
        )
    return {"repository": {"pullRequest": pr_node(state, repo, pr, base)}}


def _pr_update(state: GitHubState, variables: Vars, base: str) -> dict[str, Any]:
    given = variables.get("input") or {}
    repo, pr = _repo_of_pr(state, str(given.get("pullRequestId")))
    if "body" in given:
        pr.body = str(given["body"])
    if "title" in given:
        pr.title = str(given["title"])
    if given.get("baseRefName"):
        pr.base = str(given["baseRefName"])
    pr.updated_at = state.iso()
    return {"updatePullRequest": {"pullRequest": pr_node(state, repo, pr, base)}}


def _pr_merge(state: GitHubState, variables: Vars, base: str) -> dict[str, Any]:
    given = variables.get("input") or {}
    repo, pr = _repo_of_pr(state, str(given.get("pullRequestId")))
    if pr.state != "OPEN":
        raise GraphQLError(f"Pull request #{pr.number} is not open")
    if repo.merge_queue:
        raise GraphQLError("Changes must be made through the merge queue")
    try:
        state.merge(repo, pr, str(given.get("mergeMethod") or "MERGE"))
    except MergeConflict:
        raise GraphQLError("Pull Request is not mergeable") from None
    return {"mergePullRequest": {"clientMutationId": None, "pullRequest": pr_node(state, repo, pr, base)}}


def _pr_close(state: GitHubState, variables: Vars, base: str) -> dict[str, Any]:
    """`gh pr close N`: the closePullRequest mutation."""
    given = variables.get("input") or {}
    repo, pr = _repo_of_pr(state, str(given.get("pullRequestId")))
    if pr.state == "MERGED":
        raise GraphQLError(f"Pull request #{pr.number} is already merged")
    state.close(repo, pr)
    return {"closePullRequest": {"clientMutationId": None, "pullRequest": pr_node(state, repo, pr, base)}}


def _pr_auto_merge(state: GitHubState, variables: Vars, base: str) -> dict[str, Any]:
    """`gh pr merge` on a repository with a merge queue: the pull request joins the queue."""
    given = variables.get("input") or {}
    repo, pr = _repo_of_pr(state, str(given.get("pullRequestId")))
    if pr.state != "OPEN":
        raise GraphQLError(f"Pull request #{pr.number} is not open")
    if pr.queued_at is None:
        pr.queued_at = state.now()
        state.events.append(f"queued {repo.full_name}#{pr.number}")
    return {"enablePullRequestAutoMerge": {"clientMutationId": None}}


# What the types have, for gh's feature detection (`query X_fields{X: __type(name: "X"){fields{name}}}`).
TYPE_FIELDS = {
    "Issue": ("id", "number", "title", "body", "state", "stateReason", "closed", "url", "labels"),
    "PullRequest": (
        "id", "number", "title", "body", "state", "url", "headRefName", "baseRefName", "isDraft",
        "isInMergeQueue", "isMergeQueueEnabled", "mergeQueueEntry", "autoMergeRequest", "mergeStateStatus",
        "statusCheckRollup", "reviewDecision", "mergeCommit", "closingIssuesReferences",
    ),
    "Repository": ("id", "name", "owner", "mergeQueue", "autoMergeAllowed", "visibility"),
    "WorkflowRun": ("id", "databaseId", "event", "runNumber", "url", "workflow", "file", "checkSuite"),
}  # fmt: skip
_TYPE_ALIAS = re.compile(r'(\w+)\s*:\s*__type\(name:\s*"(\w+)"\)')


def _type_fields(state: GitHubState, variables: Vars, base: str) -> dict[str, Any]:
    found = _TYPE_ALIAS.findall(str(variables.get("query")))
    return {
        alias: {"fields": [{"name": name} for name in TYPE_FIELDS.get(type_name, ("id",))]}
        for alias, type_name in found
    }


_HANDLERS: dict[str, Callable[[GitHubState, Vars, str], dict[str, Any]]] = {
    "UserCurrent": _viewer,
    "PullRequestList": _pr_list,
    "PullRequestForBranch": _pr_list,
    "RepositoryInfo": _repo_info,
    "PullRequestCreate": _pr_create,
    "PullRequestByNumber": _pr_by_number,
    "PullRequestUpdate": _pr_update,
    "PullRequestProjectItems": _pr_by_number,
    "PullRequestMerge": _pr_merge,
    "PullRequestAutoMerge": _pr_auto_merge,
    "PullRequestClose": _pr_close,
}
