"""The console's pages as Jinja2 templates (HTML escaped by default), and their filters."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from jinja2 import DictLoader, Environment, StrictUndefined, select_autoescape

LAYOUT = """\
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }} · ordermq console</title>
{% if refresh %}<meta http-equiv="refresh" content="{{ refresh }}">{% endif %}
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2430; }
header { background: #1d2430; color: #fff; padding: 8px 16px; }
header a { color: #cfe0ff; margin-right: 16px; text-decoration: none; }
header b { margin-right: 24px; }
main { padding: 12px 16px; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border-bottom: 1px solid #dde3ea; padding: 4px 10px; text-align: left; }
th { background: #f2f5f8; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.error { background: #fde8e8; border: 1px solid #e0a0a0; padding: 8px; margin: 8px 0; }
.note { color: #5a6472; }
form { margin: 8px 0 16px; }
</style>
</head>
<body>
<header><b>ordermq</b>
<a href="/">overview</a><a href="/topics">topics</a><a href="/groups">groups</a></header>
<main>
<h1>{{ title }}</h1>
{% if error %}<p class="error" role="alert">{{ error }}</p>{% endif %}
{% block body %}{% endblock %}
</main>
</body>
</html>
"""

OVERVIEW = """\
{% extends "layout" %}
{% block body %}
<table>
<tr><th>broker</th><td>{{ s.broker_name }} (version {{ s.version }})</td></tr>
<tr><th>up for</th><td>{{ (s.uptime_ms / 1000) | duration }}</td></tr>
<tr><th>flush mode</th><td>{{ s.flush_mode }}</td></tr>
<tr><th>messages in / out per second</th>
<td>{{ "%.1f" | format(s.messages_in_per_second) }} /
{{ "%.1f" | format(s.messages_out_per_second) }}</td></tr>
<tr><th>messages stored / served since start</th>
<td>{{ s.messages_stored }} / {{ s.messages_served }}</td></tr>
<tr><th>commit log</th><td>{{ s.commit_log_bytes | size }}</td></tr>
<tr><th>data directory</th><td>{{ s.disk_bytes | size }}</td></tr>
<tr><th>file system</th><td>{{ s.disk_free_bytes | size }} free of {{ s.disk_total_bytes | size }}
({{ "%.0f" | format(s.disk_used_ratio * 100) }} % used){% if s.sends_refused %};
<b>sends refused: the disk is full</b>{% endif %}</td></tr>
<tr><th>retention</th><td>{{ s.retention_hours }} h; oldest message kept
{{ s.oldest_stored_timestamp_ms | ms }};
{{ s.retention_deleted_messages }} deleted since start</td></tr>
<tr><th>topics</th><td>{{ s.topic_count }}</td></tr>
<tr><th>pulls held</th><td>{{ s.held_pulls }}</td></tr>
<tr><th>crash recovery at start</th>
<td>{% if s.recovered_from_crash %}yes: {{ s.truncated_bytes_at_recovery | size }} truncated,
{{ s.corrupt_records_detected }} corrupt records{% else %}no{% endif %}</td></tr>
</table>
<h2>Ports</h2>
<table><tr><th>front</th><th>address</th></tr>
{% for name, address in fronts %}<tr><td>{{ name }}</td><td>{{ address }}</td></tr>{% endfor %}
</table>
<p class="note">Refreshes every {{ refresh }} s.</p>
{% endblock %}
"""

TOPICS = """\
{% extends "layout" %}
{% block body %}
<table>
<tr><th>topic</th><th>queues</th><th>retention</th></tr>
{% for t in topics %}
<tr><td><a href="/topics/{{ t.topic | urlencode }}">{{ t.topic }}</a></td>
<td class="n">{{ t.queue_count }}</td><td>{{ t.retention | retention }}</td></tr>
{% else %}<tr><td colspan="3">no topics yet</td></tr>{% endfor %}
</table>
<h2>Create a topic</h2>
<form method="post" action="/topics">
<label>name <input name="topic" required value="{{ form.topic }}"></label>
<label>queues <input name="queue_count" type="number" min="1" max="1024"
 value="{{ form.queue_count }}"></label>
<button type="submit">create</button>
</form>
{% endblock %}
"""

TOPIC = """\
{% extends "layout" %}
{% block body %}
<p>{{ t.queue_count }} queues; retention {{ t.retention | retention }}.</p>
<table>
<tr><th>queue</th><th>min offset</th><th>max offset</th><th>messages</th></tr>
{% for q in t.queues %}
<tr><td class="n">{{ q.queue_id }}</td><td class="n">{{ q.min_offset }}</td>
<td class="n">{{ q.max_offset }}</td><td class="n">{{ q.max_offset - q.min_offset }}</td></tr>
{% endfor %}
</table>
{% endblock %}
"""

GROUPS = """\
{% extends "layout" %}
{% block body %}
<table>
<tr><th>group</th><th>members</th><th>type</th><th>model</th><th>topics</th></tr>
{% for g in groups %}
<tr><td><a href="/groups/{{ g.group | urlencode }}">{{ g.group }}</a></td>
<td class="n">{{ g.members }}</td><td>{{ g.consume_type or "-" }}</td>
<td>{{ g.message_model or "-" }}</td><td>{{ g.topics | join(", ") }}</td></tr>
{% else %}<tr><td colspan="5">no groups yet</td></tr>{% endfor %}
</table>
{% endblock %}
"""

GROUP = """\
{% extends "layout" %}
{% block body %}
<h2>Members</h2>
<ul>{% for c in p.client_ids %}<li>{{ c }}</li>{% else %}<li>none now</li>{% endfor %}</ul>
<h2>Lag</h2>
<p>{{ total_lag }} messages behind in all; over the last {{ chart.span | duration }}:</p>
{{ chart.svg }}
<h2>Queues</h2>
<table>
<tr><th>topic</th><th>queue</th><th>lock owner</th><th>epoch</th><th>committed</th>
<th>max offset</th><th>lag</th><th>skipped by retention</th></tr>
{% for q in p.queues %}
<tr><td>{{ q.queue.topic }}</td><td class="n">{{ q.queue.queue_id }}</td>
<td>{{ q.lock_owner or "-" }}</td><td class="n">{{ q.lock_epoch or "-" }}</td>
<td class="n">{{ q.consumer_offset if q.consumer_offset >= 0 else "-" }}</td>
<td class="n">{{ q.broker_max_offset }}</td><td class="n">{{ q.lag }}</td>
<td class="n">{{ q.skipped }}</td></tr>
{% endfor %}
</table>
<h2>Reset offsets</h2>
<form method="post" action="/groups/{{ group | urlencode }}/reset">
<label>topic <select name="topic">
{% for t in topics %}<option>{{ t }}</option>{% endfor %}</select></label>
<label>to <select name="to">
<option value="latest">the end (skip what is there)</option>
<option value="earliest">the start (read everything again)</option>
<option value="offset">an offset</option></select></label>
<label>offset <input name="offset" type="number" min="0"></label>
<button type="submit">reset…</button>
</form>
<p class="note">Refreshes every {{ refresh }} s. A reset asks for a confirmation first.</p>
{% endblock %}
"""

CONFIRM_RESET = """\
{% extends "layout" %}
{% block body %}
<p>Move the committed offsets of group <b>{{ group }}</b> on topic <b>{{ topic }}</b>
to {{ to_words }}? Its consumers must be stopped (or this is refused).</p>
<form method="post" action="/groups/{{ group | urlencode }}/reset">
<input type="hidden" name="topic" value="{{ topic }}">
<input type="hidden" name="to" value="{{ to }}">
<input type="hidden" name="offset" value="{{ offset }}">
<input type="hidden" name="confirm" value="yes">
<button type="submit">yes, reset the offsets</button>
<a href="/groups/{{ group | urlencode }}">no, go back</a>
</form>
{% endblock %}
"""

RESET_DONE = """\
{% extends "layout" %}
{% block body %}
<table><tr><th>topic</th><th>queue</th><th>offset now</th></tr>
{% for o in offsets %}<tr><td>{{ o.topic }}</td><td class="n">{{ o.queue_id }}</td>
<td class="n">{{ o.offset }}</td></tr>{% endfor %}</table>
<p><a href="/groups/{{ group | urlencode }}">back to {{ group }}</a></p>
{% endblock %}
"""

MESSAGE = """\
{% extends "layout" %}
{% block body %}<p><a href="/">back to the overview</a></p>{% endblock %}
"""


def _size(value: Any) -> str:
    n = float(value or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _duration(seconds: Any) -> str:
    s = int(float(seconds or 0))
    days, s = divmod(s, 86_400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (s, "s")]
    shown = [f"{n} {u}" for n, u in parts if n][:2]
    return " ".join(shown) or "0 s"


def _retention(settings: Any) -> str:
    hours = float((settings or {}).get("hours") or 0)
    per_queue = int((settings or {}).get("bytes_per_queue") or 0)
    shown = [f"{hours:g} h"] if hours else []
    if per_queue:
        shown.append(f"{_size(per_queue)}/queue")
    return ", ".join(shown) or "the broker's"


def _ms(value: Any) -> str:
    ms = int(value or 0)
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds") if ms else "-"


def environment() -> Environment:
    """The templates, autoescaped, failing on a name a page does not pass."""
    env = Environment(
        loader=DictLoader(
            {
                "layout": LAYOUT,
                "overview": OVERVIEW,
                "topics": TOPICS,
                "topic": TOPIC,
                "groups": GROUPS,
                "group": GROUP,
                "confirm_reset": CONFIRM_RESET,
                "reset_done": RESET_DONE,
                "message": MESSAGE,
            }
        ),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
    )
    env.filters.update(size=_size, duration=_duration, retention=_retention, ms=_ms)
    return env
