"""Request and response models generated from a policy's spaces, so `/openapi.json` documents
each hosted agent's exact schema and pydantic rejects bad input with the field's name.

One function per space type (`functools.singledispatch`), like Gymnasium's `flatten`:

    Box ()            -> float within [low, high] (no NaN or inf)
    Box (n, ...)      -> nested lists of exactly that shape
    NamedBox          -> an object with one float field per name
    Discrete(n)       -> int in [start, start + n)
    MultiDiscrete     -> list of ints, one per component
    MultiBinary(n)    -> list of 0/1 of length n
    Dict              -> an object with one field per key
    BoundedSet        -> a list of rows of at most `max_size` items

Bounds that differ per element are checked by `space.contains` in the data plane, which names
the element; the generated types carry the overall bounds for the schema.
"""
from __future__ import annotations

import functools
import json
import re
from typing import Annotated, Any, Literal

import numpy as np
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field, conlist, create_model

from agents.spaces import BoundedSet, NamedBox

# A request with 10,000 bad rows gave a 2-MB 422 that took 0.24 s to build: the first errors name
# the problem well enough, the count says how far it goes.
MAX_ERRORS_NAMED = 20


def validation_detail(errors: list[dict], limit: int = MAX_ERRORS_NAMED, content_type: str | None = None) -> str:
    """pydantic's errors as one line naming each field ("body.cores: Input should be ..."), at most
    `limit` of them plus how many more; never the input itself (a NaN could not be written back as
    JSON). A body that is not JSON has an empty location: it is named "body". With the request's
    `content_type`, a body refused because it was not declared JSON says so."""
    parts = [f"{'.'.join(str(x) for x in e.get('loc', ())) or 'body'}: {e.get('msg')}" for e in errors[:limit]]
    if len(errors) > limit:
        parts.append(f"... and {len(errors) - limit} more error(s)")
    if content_type and not _declares_json(content_type) and any(tuple(e.get("loc", ()))[:1] == ("body",)
                                                                 for e in errors):
        # FastAPI reads a body as JSON only when its Content-Type says so: `curl -d` sends a form
        # type, and a valid request was refused as "Input should be a valid dictionary"
        parts.insert(0, f"body: not read as JSON, its Content-Type is {content_type[:80]!r} (send application/json)")
    return "; ".join(parts) or "invalid request"


def _declares_json(content_type: str) -> bool:
    """As FastAPI decides to parse a body as JSON: application/json or application/*+json."""
    kind = content_type.split(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


#: deeper than any request of the service nests (an lra observation: 3 levels); Python's parser
#: itself stops near 1,000 with a RecursionError, which FastAPI answered as an unnamed 400
MAX_JSON_DEPTH = 64


class _DuplicateKey(ValueError):
    pass


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _DuplicateKey(twice)
    return obj


def json_body_problem(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """One line naming why a JSON `body` is refused before any route reads it, or None: an object
    with the same key twice (every JSON parser here kept the last silently, so `{"batch": {"MMS": 4,
    "MMS": 2}}` planned 2), nesting deeper than `max_depth`, bytes that are not UTF-8 or a number
    Python will not read. A body that is not JSON is left to the route, which names its own problem
    (the Content-Type, where the JSON breaks)."""
    try:
        parsed = json.loads(body, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey as exc:
        return (f"body: the key {str(exc)[:80]!r} appears twice in one object (a body with the same key "
                "twice is ambiguous)")
    except RecursionError:
        return f"body: JSON nested too deeply (more than {max_depth} levels)"
    except json.JSONDecodeError:  # not JSON: the route's own error says so (its Content-Type, where)
        return None
    except UnicodeDecodeError as exc:  # these two were FastAPI's unnamed 400
        return f"body: not UTF-8 ({exc.reason}: byte {body[exc.start:exc.start + 1]!r} at {exc.start})"
    except ValueError as exc:  # a number past Python's 4,300 digits
        return f"body: not readable as JSON ({str(exc).split(';')[0][:200]})"
    if body.count(b"[") + body.count(b"{") > max_depth and _depth_over(parsed, max_depth):
        return f"body: JSON nested too deeply (more than {max_depth} levels)"
    return None


def _depth_over(value: Any, limit: int) -> bool:
    """Whether `value` nests containers deeper than `limit`: level by level, never recursing (a
    recursion is what a deep body exhausts), and never looking twice at a number."""
    level = [value] if isinstance(value, (list, dict)) else []
    for _ in range(limit):
        below: list = []
        for v in level:
            below.extend([c for c in (v.values() if type(v) is dict else v) if type(c) is list or type(c) is dict])
        if not below:
            return False
        level = below
    return True


#: how much of a name the caller gave an error line shows (a 1-MB app name was echoed whole)
MAX_NAME_SHOWN = 64


def cut_name(name: str, limit: int = MAX_NAME_SHOWN) -> str:
    """The start of a caller's `name` for an error line, marked when cut."""
    return name if len(name) <= limit else f"{name[:limit]}..."


def first_names(names: list[str], limit: int = MAX_ERRORS_NAMED) -> str:
    """At most `limit` of `names`, then how many more (as `validation_detail` names errors)."""
    shown = repr(list(names[:limit]))
    return shown if len(names) <= limit else f"{shown[:-1]}, ... and {len(names) - limit} more]"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Problem(BaseModel):
    """Every error answer: one line naming the field or the cause."""
    detail: str


_PROBLEM_REF = "#/components/schemas/Problem"
_FASTAPI_422_REF = "#/components/schemas/HTTPValidationError"


def document_errors(app, body_limit: bool) -> None:
    """Make `app`'s /openapi.json say what its errors are: FastAPI documents a route's 422 as its
    own list of error objects, while the app's handler (and every route's own 422) answers one
    line in `detail`, so a client generated from the schema failed on every 422 of the problem
    routes; with `body_limit`, every operation with a body may also answer 413 (too large) and 408
    (not complete in time)."""
    generate = app.openapi

    def openapi() -> dict:
        done = app.openapi_schema is not None
        schema = generate()
        if not done:
            _problem_errors(schema, body_limit)
        return schema

    app.openapi = openapi


#: how every route deciding with a hosted policy answers when the policy fails
AGENT_FAILED = {500: {"model": Problem, "description": "The agent failed: the detail names it and the error"}}


def add_problem_routes(app, add_routes, name: str, source) -> None:
    """`add_routes(app, name, source)` (a problem's extra routes), each documented as answering a
    500 naming the agent when its policy fails, as they all do (only /schedule said so)."""
    from fastapi.routing import APIRoute

    before = len(app.router.routes)
    add_routes(app, name, source)
    for route in app.router.routes[before:]:
        if isinstance(route, APIRoute):
            for code, response in AGENT_FAILED.items():
                route.responses.setdefault(code, response)


def _problem_errors(schema: dict, body_limit: bool) -> None:
    problem = {"application/json": {"schema": {"$ref": _PROBLEM_REF}}}
    for operations in schema.get("paths", {}).values():
        for op in operations.values():
            responses = op.setdefault("responses", {})
            r422 = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if r422.get("$ref") == _FASTAPI_422_REF:
                responses["422"] = {"description": "Invalid request: the detail names the field", "content": problem}
            for code, response in responses.items():   # a route's own error, documented without a body
                if code[0] in "45" and "content" not in response:
                    response["content"] = problem
            if body_limit and "requestBody" in op and "413" not in responses:
                responses["413"] = {"description": "Request body over the service's --max-body-mb", "content": problem}
                responses.setdefault("408", {"description": "Request body not complete within the service's "
                                                            "time limit (120 s)", "content": problem})
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.setdefault("Problem", Problem.model_json_schema())
    if _FASTAPI_422_REF not in json.dumps(schema["paths"]):  # no route answers FastAPI's own shape
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)


def _camel(name: str) -> str:
    return "".join(p[0].upper() + p[1:] for p in re.split(r"[^A-Za-z0-9]+", name) if p)


def _finite(v: float) -> float | None:
    v = float(v)
    return v if np.isfinite(v) else None


def _float_type(low: np.ndarray, high: np.ndarray, integer: bool = False):
    lo, hi = _finite(np.min(low)), _finite(np.max(high))
    base = int if integer else float
    kw = {} if integer else {"allow_inf_nan": False}
    return Annotated[base, Field(ge=lo, le=hi, **({"strict": False} | kw))]


def _nested(item, shape: tuple[int, ...]):
    t = item
    for n in reversed(shape):
        t = conlist(t, min_length=n, max_length=n)
    return t


@functools.singledispatch
def field_type(space: spaces.Space, name: str) -> Any:
    raise TypeError(f"{name}: no request schema for {type(space).__name__}")


@field_type.register
def _(space: spaces.Box, name: str) -> Any:
    integer = np.issubdtype(space.dtype, np.integer)
    item = _float_type(space.low, space.high, integer)
    if isinstance(space, NamedBox):
        lows, highs = space.low, space.high
        fields = {n: (_float_type(lows[i], highs[i]), ...) for i, n in enumerate(space.names)}
        return create_model(_camel(name), __base__=Strict, **fields)
    return item if space.shape == () else _nested(item, space.shape)


@field_type.register
def _(space: spaces.Discrete, name: str) -> Any:
    return Annotated[int, Field(ge=int(space.start), le=int(space.start + space.n - 1))]


@field_type.register
def _(space: spaces.MultiDiscrete, name: str) -> Any:
    nvec = np.asarray(space.nvec)
    item = Annotated[int, Field(ge=0, le=int(nvec.max()) - 1)]
    return _nested(item, nvec.shape)


@field_type.register
def _(space: spaces.MultiBinary, name: str) -> Any:
    shape = tuple(np.atleast_1d(space.n).tolist())
    return _nested(Annotated[int, Field(ge=0, le=1)], shape)


@field_type.register
def _(space: spaces.Dict, name: str) -> Any:
    fields = {k: (field_type(s, f"{name}_{k}"), ...) for k, s in space.spaces.items()}
    return create_model(_camel(name), __base__=Strict, **fields)


@field_type.register
def _(space: BoundedSet, name: str) -> Any:
    row = field_type(space.row, f"{name}_row")
    return conlist(row, max_length=space.max_size)


def mask_type(action_space: spaces.Space) -> Any | None:
    """Masks exist for Discrete actions (Gymnasium's `action_mask`): one 0/1 per action."""
    if isinstance(action_space, spaces.Discrete):
        return _nested(Annotated[int, Field(ge=0, le=1)], (int(action_space.n),))
    return None


#: what the generic decide route did with a policy's memory between calls
MEMORY_DOC = ("What became of the policy's memory of earlier calls: 'none', it keeps none; 'session', kept "
              "under session_id for the next call; 'not kept', the policy keeps one per session but the call "
              "named no session_id, so it decided from an empty memory and nothing was kept.")


def decide_models(agent_name: str, policy) -> tuple[type[BaseModel], type[BaseModel]]:
    base = _camel(agent_name)
    obs = field_type(policy.observation_space, f"{base}Observation")
    act = field_type(policy.action_space, f"{base}Action")
    fields: dict[str, Any] = {
        "session_id": (str | None, Field(default=None, pattern=r"^[A-Za-z0-9._:-]{1,128}$",
                                         description="Caller's session (stateful policies keep state per session).")),
        "observation": (obs, Field(description="An element of the agent's observation space.")),
        "deterministic": (bool, True),
    }
    mt = mask_type(policy.action_space)
    if mt is not None:
        fields["action_mask"] = (mt | None, Field(default=None, description="1 = allowed (Gymnasium's action_mask)."))
    req = create_model(f"{base}DecideRequest", __base__=Strict, **fields)
    resp = create_model(f"{base}DecideResponse", action=(act, ...), action_name=(str | None, None),
                        info=(dict[str, Any], Field(default_factory=dict)), policy_version=(str, ...),
                        session_id=(str | None, None),
                        memory=(Literal["none", "session", "not kept"],
                                Field("none", description=MEMORY_DOC)))
    return req, resp
