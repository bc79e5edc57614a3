"""The parts of the seed's mcp_worker_identity that its planner calls, as
docs/semantics.md sections 1-4 settle them: strict stamps, the canonical TTL,
liveness, client names. Used only by the differential test.
"""
import re
from datetime import datetime, timezone, timedelta
STATUS_ACTIVE = "active"
UNKNOWN_CLIENT = "unknown"
IDENTITY_TIMESTAMP_FORMAT = "%Y%m%dT%H%M%SZ"
CLIENT_ALIASES = {"codex": "codex", "openai_codex": "codex", "codex_cli": "codex",
    "claude": "claude_code", "claude_code": "claude_code", "claudecode": "claude_code",
    "claude_desktop": "claude_desktop", "gemini": "gemini", "gemini_cli": "gemini",
    "grok": "grok", "grok_cli": "grok", "cursor": "cursor"}
def normalize_client_name(x):
    if x is None or not str(x).strip(): return UNKNOWN_CLIENT
    k = str(x).strip().lower().replace("-", "_").replace(" ", "_")
    return CLIENT_ALIASES.get(k, UNKNOWN_CLIENT)
_TS = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?(Z|[+-][0-9]{2}:[0-9]{2})\Z")
def _parse_ts(v):
    if not isinstance(v, str): return None
    m = _TS.match(v)
    if not m: return None
    y, mo, d, h, mi, s, frac, z = m.groups()
    try:
        us = int((frac or "0")[:6].ljust(6, "0"))
        dt = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), us, tzinfo=timezone.utc)
        if z != "Z":
            hh, mm = int(z[1:3]), int(z[4:6])
            if hh >= 24 or mm >= 60: return None
            off = timedelta(hours=hh, minutes=mm)
            dt = dt - off if z[0] == "+" else dt + off
        return dt
    except (ValueError, OverflowError):
        return None
_NUM = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
def _ttl(v):
    t = None
    if isinstance(v, bool): t = None
    elif isinstance(v, (int, float)): t = float(v)
    elif isinstance(v, str) and _NUM.fullmatch(v): t = float(v)
    if t is not None and t == t and t not in (float("inf"), float("-inf")) and t > 0: return t
    return 900.0
class WorkerRegistry:
    @staticmethod
    def is_live(record, now=None, pid_alive=None):
        ttl = _ttl(record.get("heartbeat_ttl_seconds"))
        hb = _parse_ts(record.get("last_heartbeat_at"))
        age = None if hb is None else (now - hb).total_seconds()
        fresh = None if age is None else age <= ttl
        live = record.get("status") == "active" and fresh is True and pid_alive is not False
        return {"live": live, "heartbeat_fresh": fresh, "heartbeat_age_seconds": age,
                "heartbeat_ttl_seconds": ttl, "pid_alive": pid_alive}
