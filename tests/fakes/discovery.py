"""Google's discovery documents as the fakes' contract: requests checked, answers checked.

A hand-kept fake is how a wrong assumption survives until a first real deploy, so every fake of
a Google REST API wraps its handler in `guarded(Discovery.load(api, version), handler)`. The
documents are the static files google-api-python-client ships (a pinned dev dependency:
`googleapiclient/discovery_cache/documents/<api>.<version>.json`).

Requests: the method and path against each method's `path` (with `{+name}` reserved expansion
and the parameter's `pattern`) and `flatPath` under the document's servicePath, or a media
upload path (`mediaUpload.protocols`); query parameters against the method's and the
document's standard `parameters` (type, enum, repeated, pattern, required; unknown ones
refused); the body against `request.$ref` (unknown fields, JSON types, formats, enums, and
read-only fields: `readOnly: true` or a description beginning "Output only" / "[Output Only]").
Refusing read-only fields is stricter than Google (AIP-203 has servers ignore them) on purpose:
it catches code that writes back what it read. Field names are the document's camelCase ones;
proto-backed APIs also accept snake_case, refused here too (one spelling, the documented one).

An unmatched path, or a known path with the wrong HTTP method, gets the Google front end's
HTML "404. That's an error." page, as googleapis.com answers before any API sees the request.

Answers: a 2xx JSON body against `response.$ref` (unknown fields, types, enums, null). int64
values must be decimal strings there, as Google writes them; requests may send either. A
violation is recorded on the document (`Discovery.violations`, and `all_violations()`) and
answered as a 500, so the test using the fake fails loudly. Answers marked `deliberate(...)`
(the fault injections a test asks for), dropped connections, non-2xx and non-JSON answers
pass through.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import googleapiclient
from werkzeug.wrappers import Request, Response

DOCUMENTS = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"

_DURATION = re.compile(r"-?\d+(\.\d{1,9})?s")
_DATETIME = re.compile(r"\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(\.\d{1,9})?([Zz]|[+-]\d\d:\d\d)")
_DATE = re.compile(r"\d{4}-\d\d-\d\d")
_FIELD_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.([A-Za-z_][A-Za-z0-9_]*|\*))*|\*")
_DECIMAL = re.compile(r"-?\d+")
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]*={0,2}")
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1),
               "int64": (-(2**63), 2**63 - 1), "uint64": (0, 2**64 - 1)}
_BEHAVIOR_TAGS = re.compile(r"^(?:(?:optional|required|immutable|identifier)\.\s*)+")
_TEMPLATE_VAR = re.compile(r"\{(\+?)([^}]+)\}")
_REGISTRY: list[Discovery] = []  # every document compiled in this process

NOT_FOUND_PAGE = (
    "<!DOCTYPE html>\n<html lang=en>\n  <meta charset=utf-8>\n"
    "  <title>Error 404 (Not Found)!!1</title>\n"
    "  <p><b>404.</b> <ins>That\u2019s an error.</ins>\n"
    "  <p>The requested URL <code>{path}</code> was not found on this server."
    "  <ins>That\u2019s all we know.</ins>\n")


class DiscoveryRefusal(Exception):
    """A request the document refuses, with the error Google answers for it."""

    def __init__(self, code: int, status: str, message: str, *,
                 field_violations: Iterable[tuple[str, str]] = (), html_page: bool = False,
                 path: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message
        self.field_violations = list(field_violations)  # (field, description)
        self.html_page = html_page  # the front end's 404 page, not an API's JSON
        self.path = path

    def body(self) -> dict[str, Any]:
        """google.rpc.Status in its JSON form, a BadRequest detail for field errors."""
        error: dict[str, Any] = {"code": self.code, "message": self.message,
                                 "status": self.status}
        if self.field_violations:
            error["details"] = [{
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": f, "description": d} if f else {"description": d}
                                    for f, d in self.field_violations],
            }]
        return {"error": error}

    def response(self, *, legacy_errors: bool = False) -> Response:
        if self.html_page:
            page = NOT_FOUND_PAGE.format(path=html.escape(self.path))
            return Response(page, self.code, mimetype="text/html")
        body = self.body()
        if legacy_errors:  # Storage's JSON API: {"code", "message", "errors": [...]}
            body = {"error": {"code": self.code, "message": self.message, "errors": [
                {"domain": "global", "reason": "invalid" if self.code == 400 else "notFound",
                 "message": self.message}]}}
        return Response(json.dumps(body), self.code, mimetype="application/json")


class ResponseViolation(AssertionError):
    """A fake answered a body its discovery document refuses."""


@dataclass(frozen=True)
class Call:
    """A request the document accepts: its method and its path parameters (decoded)."""

    method_id: str
    params: dict[str, str]
    alt: str = "json"     # "media": a download, its answer is the object's bytes
    upload: str = ""      # uploadType on a media upload path: media, multipart, resumable
    session: bool = False  # a resumable upload's later request (upload_id): bytes, no JSON


@dataclass(frozen=True)
class _Route:
    method: dict[str, Any]
    regex: re.Pattern[str]
    names: tuple[str, ...]     # group i -> parameter name
    flat: re.Pattern[str] | None
    literal: int               # literal characters: the most specific template wins
    upload: str                # "" or the mediaUpload protocol ("simple", "resumable")


def _compile(template: str, *, named: bool) -> tuple[re.Pattern[str], tuple[str, ...], int]:
    parts: list[str] = []
    names: list[str] = []
    literal = 0
    at = 0
    for m in _TEMPLATE_VAR.finditer(template):
        parts.append(re.escape(template[at:m.start()]))
        literal += m.start() - at
        segment = "[^?#]+" if m[1] else "[^/?#]+"
        if named:
            parts.append(f"(?P<g{len(names)}>{segment})")
            names.append(m[2])
        else:
            parts.append(segment)
        at = m.end()
    parts.append(re.escape(template[at:]))
    literal += len(template) - at
    return re.compile("".join(parts)), tuple(names), literal


def _read_only(prop: Mapping[str, Any]) -> bool:
    if prop.get("readOnly") is True:
        return True
    text = str(prop.get("description", "")).lstrip().lower()
    # Field-behavior tags come first and in any order: "Optional. Output only. ..." (Secret
    # Manager's SecretVersion.scheduledDestroyTime), "Required. Output only. ...".
    text = _BEHAVIOR_TAGS.sub("", text)
    return text.startswith(("output only", "output-only", "[output only]", "[output-only]"))


def _walk(resources: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    for resource in resources.values():
        yield from resource.get("methods", {}).values()
        yield from _walk(resource.get("resources", {}))


class Discovery:
    """One API version's discovery document, compiled for checking requests and answers."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        self.name = f"{document['name']}.{document['version']}"
        self.schemas: Mapping[str, Any] = document.get("schemas", {})
        self.standard: Mapping[str, Any] = document.get("parameters", {})
        self.violations: list[str] = []
        self.refusals: list[str] = []  # what guarded refused, for a test's or a reader's eyes
        # ESF/One Platform APIs (proto-backed) take $.xgafv and name fields in snake_case in
        # their errors (`at 'node.network_config'`), as the proto request message has them.
        self.proto = "$.xgafv" in self.standard
        self.methods: dict[str, dict[str, Any]] = {}
        self._routes: list[_Route] = []
        base = "/" + document.get("servicePath", "")
        for method in _walk(document.get("resources", {})):
            self.methods[method["id"]] = method
            self._routes.append(self._route(method, base + method["path"],
                                            method.get("flatPath"), base, ""))
            for protocol, spec in method.get("mediaUpload", {}).get("protocols", {}).items():
                self._routes.append(self._route(method, spec["path"], None, "", protocol))
        _REGISTRY.append(self)

    @staticmethod
    def _route(method: dict[str, Any], path: str, flat: str | None, base: str,
               upload: str) -> _Route:
        regex, names, literal = _compile(path, named=True)
        flat_regex = None
        if flat is not None:
            flat_regex, _, literal = _compile(base + flat, named=False)
        return _Route(method, regex, names, flat_regex, literal, upload)

    @classmethod
    def load(cls, api: str, version: str) -> Discovery:
        """The document google-api-python-client ships; one compiled copy per process."""
        return _load(api, version)

    # ------------------------------------------------------------------ requests
    def check_request(self, http_method: str, path: str, query: Mapping[str, list[str]],
                      body: Any | None) -> Call:
        """The Call a request makes, or DiscoveryRefusal with the error Google answers.

        `path` is the raw (percent-encoded) path as received; `body` is the parsed JSON, None
        for no body, or bytes/str not yet parsed (media uploads keep theirs unparsed).
        """
        route, params = self._match(http_method.upper(), path)
        method = route.method
        upload = ""
        session = False
        if route.upload:
            upload = (query.get("uploadType") or [""])[0]
            allowed = {"media", "multipart"} if route.upload == "simple" else {"resumable"}
            if route.upload == "simple" and "resumable" in method["mediaUpload"]["protocols"]:
                allowed.add("resumable")
            if upload not in allowed:
                raise _invalid("Upload requests must include an uploadType URL parameter and a "
                               f"URL-encoded object name (one of {sorted(allowed)}); got "
                               f"{upload!r}.", "uploadType")
            session = "upload_id" in query
            if not session and http_method.upper() != "POST":
                raise _not_found(path)  # only a session's later requests PUT (or DELETE)
        elif http_method.upper() != method["httpMethod"]:
            raise _not_found(path)
        alt = self._check_query(method, query, session=session)
        if alt == "media" and not method.get("supportsMediaDownload"):
            raise _invalid(f"alt=media is not supported by {method['id']}.", "alt")
        if session or upload == "media":
            return Call(method["id"], params, alt, upload, session)
        if isinstance(body, bytes | str):
            body = _parse_json(body)
        if body is not None:
            request = method.get("request")
            if request is None:
                raise _invalid(f"{method['id']} takes no request body.", "")
            out: list[tuple[str, str]] = []
            self._check(request, body, self._body_field(request["$ref"]), "request", out,
                        identity=params)
            if out:
                raise DiscoveryRefusal(400, "INVALID_ARGUMENT", out[0][1], field_violations=out)
        return Call(method["id"], params, alt, upload, session)

    def _body_field(self, ref: str) -> str:
        """Where a proto-backed API's error messages place the body: the request message's
        field holding it (`node`, `queued_resource`; none for a `...Request` body, bound as
        `*`). Storage's JSON API is not proto-backed: plain JSON names from the root."""
        if not self.proto or ref.endswith("Request"):
            return ""
        return _snake(ref)

    def _match(self, http_method: str, path: str) -> tuple[_Route, dict[str, str]]:
        raw = urlsplit(path).path if "://" in path else path.split("?", 1)[0]
        found: list[tuple[_Route, dict[str, str]]] = []
        for route in self._routes:
            m = route.regex.fullmatch(raw)
            if m is None or (route.flat is not None and route.flat.fullmatch(raw) is None):
                continue
            params = {route.names[i]: unquote(v) for i, v in enumerate(m.groups())}
            specs = route.method.get("parameters", {})
            if all(re.fullmatch(specs.get(name, {}).get("pattern", ".*"), value)
                   for name, value in params.items()):
                found.append((route, params))
        # The wrong HTTP method on a known path is unknown to the front end, too.
        same = [(r, p) for r, p in found
                if r.method["httpMethod"] == http_method
                or (r.upload and http_method in ("PUT", "POST", "DELETE"))]
        if not same:
            raise _not_found(raw)
        return max(same, key=lambda rp: (rp[0].literal, rp[0].method["httpMethod"]
                                          == http_method))

    def _check_query(self, method: Mapping[str, Any], query: Mapping[str, list[str]], *,
                     session: bool) -> str:
        specs = method.get("parameters", {})
        for name, values in query.items():
            spec = specs.get(name) if specs.get(name, {}).get("location") == "query" else None
            # System parameters also go by a "$" name ($alt, $fields: google-cloud-* REST
            # transports send `$alt=json;enum-encoding=int`).
            spec = spec or self.standard.get(name) or (
                self.standard.get(name[1:]) if name.startswith("$") else None)
            if spec is None and session and name == "upload_id":
                continue
            if spec is None:
                text = (f'Invalid JSON payload received. Unknown name "{name}": Cannot bind '
                        f"query parameter. Field '{name}' could not be found in request "
                        "message.")
                raise DiscoveryRefusal(400, "INVALID_ARGUMENT", text,
                                       field_violations=[("", text)])
            if len(values) > 1 and not spec.get("repeated"):
                raise _invalid(f'Invalid JSON payload received. Multiple values for the '
                               f'non-repeated query parameter "{name}".', name)
            for value in values:
                if name in ("alt", "$alt"):
                    value = value.split(";", 1)[0]  # options: json;enum-encoding=int
                problem = _scalar(spec, value, from_query=True)
                if problem:
                    raise _invalid(f"Invalid value at '{name}' ({problem}), \"{value}\"", name)
        for name, spec in specs.items():
            if spec.get("location") == "query" and spec.get("required") and name not in query:
                raise _invalid(f"Required parameter: {name}", name)
        return (query.get("alt") or query.get("$alt") or ["json"])[0].split(";", 1)[0]

    # ------------------------------------------------------------------ answers
    def check_response(self, call: Call, body: Any) -> None:
        """ResponseViolation unless `body` is what the method's response schema allows."""
        method = self.methods[call.method_id]
        response = method.get("response")
        if response is None:
            if body not in (None, {}):
                raise ResponseViolation(f"{self.name} {call.method_id} answers no body; the "
                                        f"fake answered {json.dumps(body)[:200]}")
            return
        out: list[tuple[str, str]] = []
        self._check(response, body, "", "response", out)
        if out:
            raise ResponseViolation(f"{self.name} {call.method_id} ({response['$ref']}): "
                                    + "; ".join(d for _, d in out[:5]))

    # ------------------------------------------------------------------ the schema walk
    def _check(self, schema: Mapping[str, Any], value: Any, at: str, mode: str,
               out: list[tuple[str, str]], identity: Mapping[str, str] | None = None) -> None:
        """Append (field, description) to `out` for each way `value` breaks `schema`.

        `identity`: the request's path parameters. A top-level read-only field that repeats
        its own path parameter (nodes.patch's `name`, bound to the URL as `{+name}`:
        google-cloud-tpu sends the resource's name in the body) is the request's target, not
        an output written back, and is accepted when it names the same resource.
        """
        ref = schema.get("$ref")
        if ref is not None:
            schema = self.schemas[ref]
        where = f" at '{at}'" if at else ""
        if value is None:
            if mode == "response":  # Google omits unset fields; a null proves nothing
                out.append((at, f"null{where}: Google omits unset fields"))
            return  # proto3 JSON (and Storage's patch) take null as "unset" in a request
        kind = schema.get("type")
        if kind == "any":
            return
        if kind == "object" or (kind is None and "properties" in schema):
            if not isinstance(value, dict):
                out.append((at, (f"Invalid value{where} ({ref or 'object'}), "
                                f"{json.dumps(value)[:80]}: expected an object")))
                return
            props = schema.get("properties", {})
            extra = schema.get("additionalProperties")
            for key, item in value.items():
                name = _snake(key) if self.proto and mode == "request" and key in props else key
                child = f"{at}.{name}" if at else name
                if key not in props and extra is not None:
                    child = f"{at}[{key}]"
                if key in props:
                    echo = identity is not None and identity.get(key) == item
                    if mode == "request" and _read_only(props[key]) and not echo:
                        out.append((child, (f"Field '{child}' is output only (read-only) and "
                                           "may not be set in a request.")))
                        continue
                    self._check(props[key], item, child, mode, out)
                elif extra is not None:
                    self._check(extra, item, child, mode, out)
                else:
                    out.append((at, (f'Invalid JSON payload received. Unknown name "{key}"'
                                    f"{where}: Cannot find field.")))
            return
        if kind == "array":
            if not isinstance(value, list):
                out.append((at, (f"Invalid value{where} (array), {json.dumps(value)[:80]}: "
                                "expected a list")))
                return
            for i, item in enumerate(value):
                self._check(schema.get("items", {}), item, f"{at}[{i}]", mode, out)
            return
        problem = _scalar(schema, value, from_query=False, strict_int64=mode == "response")
        if problem:
            out.append((at, f"Invalid value{where} ({problem}), {json.dumps(value)[:80]}"))


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _scalar(spec: Mapping[str, Any], value: Any, *, from_query: bool,
            strict_int64: bool = False) -> str:
    """'' if `value` fits the scalar `spec`, else what it should have been.

    A query parameter is always a string: its integer/boolean forms are parsed from the text.
    """
    kind = spec.get("type")
    fmt = spec.get("format", "")
    if kind == "boolean":
        ok = value in ("true", "false") if from_query else isinstance(value, bool)
        return "" if ok else "TYPE_BOOL"
    if kind == "integer":
        if isinstance(value, bool):
            return "TYPE_INT32"
        if isinstance(value, str) and strict_int64 and not from_query:
            return f"TYPE_{fmt.upper() or 'INT32'}: a JSON number"  # Google writes int32 so
        if isinstance(value, str) and _DECIMAL.fullmatch(value):
            value = int(value)
        if not isinstance(value, int):
            return f"TYPE_{fmt.upper() or 'INT32'}"
        low, high = _INT_RANGES.get(fmt, _INT_RANGES["int32"])
        return "" if low <= value <= high else f"{fmt or 'int32'} out of range"
    if kind == "number":
        if isinstance(value, str) and not from_query:
            return "" if value in ("NaN", "Infinity", "-Infinity") else "TYPE_DOUBLE"
        if from_query:
            try:
                float(value)
            except ValueError:
                return "TYPE_DOUBLE"
            return ""
        return "" if isinstance(value, int | float) and not isinstance(value, bool) else (
            "TYPE_DOUBLE")
    if kind != "string":
        return ""  # "any" and untyped leaves
    if fmt in ("int64", "uint64"):
        if isinstance(value, int) and not isinstance(value, bool) and not strict_int64:
            value = str(value)
        if not (isinstance(value, str) and _DECIMAL.fullmatch(value)):
            return (f"TYPE_{fmt.upper()}: a decimal string" if strict_int64
                    else f"TYPE_{fmt.upper()}")
        low, high = _INT_RANGES[fmt]
        return "" if low <= int(value) <= high else f"{fmt} out of range"
    if not isinstance(value, str):
        return "TYPE_STRING"
    enum = spec.get("enum")
    if enum is not None and value not in enum:
        return f"enum, one of {', '.join(enum[:12])}{', ...' if len(enum) > 12 else ''}"
    checks: dict[str, Callable[[str], bool]] = {
        "google-duration": lambda v: bool(_DURATION.fullmatch(v)),
        "google-datetime": lambda v: bool(_DATETIME.fullmatch(v)),
        "date-time": lambda v: bool(_DATETIME.fullmatch(v)),
        "date": lambda v: bool(_DATE.fullmatch(v)),
        "google-fieldmask": lambda v: v == "" or all(_FIELD_PATH.fullmatch(p.strip())
                                                     for p in v.split(",")),
        "byte": _is_base64,
    }
    check = checks.get(fmt)
    if check is not None and not check(value):
        return f"format {fmt}"
    pattern = spec.get("pattern")
    if from_query and pattern and not re.fullmatch(pattern, value):
        return f"pattern {pattern}"
    return ""


def _is_base64(text: str) -> bool:
    if not _BASE64.fullmatch(text):
        return False
    try:
        base64.urlsafe_b64decode(text.replace("+", "-").replace("/", "_")
                                 + "=" * (-len(text.rstrip("=")) % 4))
    except ValueError:
        return False
    return True


def _parse_json(raw: bytes | str) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        text = "Invalid JSON payload received. Unexpected token."
        raise DiscoveryRefusal(400, "INVALID_ARGUMENT", text,
                               field_violations=[("", text)]) from None


def _invalid(message: str, name: str) -> DiscoveryRefusal:
    return DiscoveryRefusal(400, "INVALID_ARGUMENT", message,
                            field_violations=[(name, message)])


def _not_found(path: str) -> DiscoveryRefusal:
    return DiscoveryRefusal(404, "NOT_FOUND", f"The requested URL {path} was not found on "
                            "this server.", html_page=True, path=path)


_LOCK = threading.Lock()


@functools.cache
def _load(api: str, version: str) -> Discovery:
    document = DOCUMENTS / f"{api}.{version}.json"
    with _LOCK:
        return Discovery(json.loads(document.read_text(encoding="utf-8")))


def all_violations() -> list[str]:
    """Every answer a fake gave that its document refuses, over the documents loaded so far."""
    return [v for doc in _loaded() for v in doc.violations]


def _loaded() -> list[Discovery]:
    return list(_REGISTRY)


def violation_mark() -> dict[int, int]:
    """How many violations each loaded document holds now (for `violations_since`)."""
    return {id(doc): len(doc.violations) for doc in _loaded()}


def violations_since(mark: Mapping[int, int]) -> list[str]:
    """The violations recorded after `mark` was taken, over every document loaded."""
    return [v for doc in _loaded() for v in doc.violations[mark.get(id(doc), 0):]]


# ---------------------------------------------------------------------- werkzeug
def deliberate(response: Response) -> Response:
    """Mark a fault a test asked for (a `{}`, `null`, a wrong shape): guarded passes it on."""
    response.deliberate = True  # type: ignore[attr-defined]
    return response


def request_body(request: Request) -> Any:
    """What check_request takes from a werkzeug request: multipart/related gives its JSON
    part (the metadata of a multipart upload), anything else its raw bytes (None if empty)."""
    data = request.get_data(cache=True)
    if request.mimetype == "multipart/related":
        header = f"Content-Type: {request.headers.get('Content-Type', '')}\r\n\r\n".encode()
        message = BytesParser(policy=HTTP).parsebytes(header + data)
        parts = list(message.iter_parts()) if message.is_multipart() else []
        if not parts:
            raise _invalid("Invalid multipart request with 0 mime parts.", "")
        return parts[0].get_content().encode() if isinstance(parts[0].get_content(), str) \
            else parts[0].get_content()
    return data or None


def raw_path(request: Request) -> str:
    """The path as the client sent it: percent-encoding kept (`a%2Fb` is one object name)."""
    raw = request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI")
    if not raw:
        return request.path
    return urlsplit(raw).path if "://" in raw else raw.split("?", 1)[0]


def guarded(doc: Discovery, handler: Callable[[Request], Response]) -> Callable[
        [Request], Response]:
    """`handler` behind the document: invalid requests refused the way Google refuses them,
    2xx JSON answers checked against the method's response schema (a violation: 500)."""
    legacy = doc.name.startswith("storage.")

    def wrapped(request: Request) -> Response:
        query = parse_qs(request.query_string.decode("latin-1"), keep_blank_values=True)
        try:
            call = doc.check_request(request.method, raw_path(request), query,
                                     request_body(request))
        except DiscoveryRefusal as refusal:
            doc.refusals.append(f"{request.method} {request.full_path}: {refusal.message}")
            return refusal.response(legacy_errors=legacy)
        response = handler(request)
        return check_answer(doc, call, response)

    return wrapped


def check_answer(doc: Discovery, call: Call, response: Response) -> Response:
    """`response` itself, or a 500 naming what the document refuses in it (also recorded)."""
    if (getattr(response, "drop", False) or getattr(response, "deliberate", False)
            or not 200 <= response.status_code < 300 or call.alt != "json"
            or response.is_streamed):
        return response
    data = response.get_data()
    if not data:
        return response
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return response
    try:
        doc.check_response(call, body)
    except ResponseViolation as violation:
        doc.violations.append(str(violation))
        error = {"error": {"code": 500, "status": "INTERNAL",
                           "message": f"fake answer refused by the discovery document: "
                                      f"{violation}"}}
        return Response(json.dumps(error), 500, mimetype="application/json")
    return response


__all__ = ["Call", "Discovery", "DiscoveryRefusal", "ResponseViolation", "all_violations",
           "check_answer", "deliberate", "guarded", "raw_path", "request_body", "violation_mark",
           "violations_since"]
