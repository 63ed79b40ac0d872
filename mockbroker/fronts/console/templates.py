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
pre.body { background: #f7f9fb; border: 1px solid #dde3ea; padding: 8px; overflow-x: auto;
 white-space: pre-wrap; word-break: break-all; max-width: 1100px; }
td.id { font-family: ui-monospace, monospace; font-size: 12px; }
form.inline { display: inline; margin: 0; }
</style>
</head>
<body>
<header><b>ordermq</b>
<a href="/">overview</a><a href="/topics">topics</a><a href="/groups">groups</a>
<a href="/messages">messages</a></header>
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
<tr><td class="n"><a href="/topics/{{ t.topic | urlencode }}/queues/{{ q.queue_id }}">{{
 q.queue_id }}</a></td><td class="n">{{ q.min_offset }}</td>
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
<h2>Dead letters</h2>
<p>{% if dead is none %}none: the group has no dead-letter topic yet{% else %}
{{- dead }} dead letter(s) not resent yet{% endif %}:
<a href="/groups/{{ group | urlencode }}/dlq">dead letters of {{ group }}</a></p>
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

MESSAGE_ROWS = """\
{% macro rows(found, with_topic=True) %}
<table>
<tr>{% if with_topic %}<th>topic</th><th>queue</th>{% endif %}<th>offset</th><th>stored</th>
<th>id</th><th>sharding key</th><th>keys</th><th>tags</th><th>body</th></tr>
{% for m in found %}
<tr>{% if with_topic %}<td>{{ m.topic }}</td><td class="n">{{ m.queue_id }}</td>{% endif %}
<td class="n">{{ m.offset }}</td><td>{{ m.stored_ms | ms }}</td>
<td class="id"><a href="/messages/{{ m.msg_id | urlencode }}">{{ m.msg_id }}</a></td>
<td>{{ m.sharding_key or "-" }}</td><td>{{ m.key_list | join(", ") or "-" }}</td>
<td>{{ m.tags or "-" }}</td><td>{{ m.preview }}</td></tr>
{% endfor %}
</table>
{% endmacro %}
"""

SEARCH = """\
{% extends "layout" %}
{% from "message_rows" import rows %}
{% block body %}
<h2>By id</h2>
<form method="get" action="/messages">
<label>id <input name="id" size="40" value="{{ form.id }}"></label>
<button type="submit">show</button>
<span class="note">ordermq's, RocketMQ 4.x's msgId or offsetMsgId, or RocketMQ 5's</span>
</form>
<h2>By key or sharding key</h2>
<form method="get" action="/messages">
<label>topic <input name="topic" value="{{ form.topic }}"></label>
<label>key <input name="key" value="{{ form.key }}"></label>
<label>which <select name="by">
<option value="key"{% if form.by == "key" %} selected{% endif %}>a key (keys=)</option>
<option value="sharding"{% if form.by == "sharding" %} selected{% endif %}>the sharding
 key</option></select></label>
<button type="submit">find</button>
</form>
{% if form.key and form.topic and not error %}
{% if found %}<p>{{ found | length }} message(s), newest first.</p>{{ rows(found) }}
{% else %}<p>{{ searched }}</p>{% endif %}
{% endif %}
<p class="note">A key is searched through the broker's index; a sharding key by reading the
newest 10,000 messages of the queue it maps to.</p>
{% endblock %}
"""

MESSAGE_PAGE = """\
{% extends "layout" %}
{% block body %}
{% if not original_kept %}<p class="note">The original is no longer stored (retention or a
deleted topic); this is its oldest copy.</p>{% endif %}
<table>
<tr><th>topic</th><td><a href="/topics/{{ m.topic | urlencode }}">{{ m.topic }}</a></td></tr>
<tr><th>queue, offset</th><td><a href="/topics/{{ m.topic | urlencode }}/queues/{{
 m.queue_id }}?offset={{ m.offset }}">queue {{ m.queue_id }}, offset {{ m.offset }}</a></td></tr>
<tr><th>id</th><td class="id">{{ m.msg_id }}</td></tr>
<tr><th>born / stored</th><td>{{ m.born_ms | ms }} / {{ m.stored_ms | ms }}</td></tr>
<tr><th>sharding key</th><td>{{ m.sharding_key or "-" }}</td></tr>
<tr><th>keys</th><td>{{ m.key_list | join(", ") or "-" }}</td></tr>
<tr><th>tags</th><td>{{ m.tags or "-" }}</td></tr>
<tr><th>body</th><td>{{ m.size | size }}</td></tr>
</table>
<h2>Body</h2>
<p>{% if hex %}As hex. <a href="/messages/{{ msg_id | urlencode }}">as text</a>
{% else %}As {{ "JSON (pretty-printed)" if body.kind == "json" else ("text" if body.kind ==
 "text" else "hex: it is not UTF-8") }}.
<a href="/messages/{{ msg_id | urlencode }}?view=hex">as hex</a>{% endif %}</p>
<pre class="body">{{ body.text }}</pre>
{% if body.cut %}<p class="note">{{ body.cut }} more bytes not shown (of {{ body.size }}).</p>
{% endif %}
<h2>Properties</h2>
<table><tr><th>name</th><th>value</th></tr>
{% for k, v in m.properties.items() %}<tr><td>{{ k }}</td><td>{{ v }}</td></tr>
{% else %}<tr><td colspan="2">none</td></tr>{% endfor %}
</table>
<h2>Trace</h2>
<table><tr><th>what</th><th>when</th><th>where</th><th>id</th></tr>
{% for c in trace %}
<tr><td>{{ c.words }}{% if c.kind == "dead-lettered" %}
 (<a href="/groups/{{ c.group | urlencode }}/dlq">dead letters of {{ c.group }}</a>){% endif %}</td>
<td>{{ c.stored_ms | ms }}</td><td>{{ c.topic }} queue {{ c.queue_id }} offset {{ c.offset }}</td>
<td class="id">{{ c.msg_id }}</td></tr>
{% endfor %}
</table>
{% if original_kept %}
<table><tr><th>group reading {{ m.topic }}</th><th>committed on queue {{ m.queue_id }}</th>
<th>this message</th></tr>
{% for g in groups %}<tr><td><a href="/groups/{{ g.group | urlencode }}">{{ g.group }}</a></td>
<td class="n">{{ g.committed if g.committed >= 0 else "-" }}</td>
<td>{{ "delivered and consumed (committed past it)" if g.past else "not consumed yet" }}</td></tr>
{% else %}<tr><td colspan="3">no group reads {{ m.topic }}</td></tr>{% endfor %}
</table>
{% endif %}
<p class="note">What the broker knows: when and where it stored the message, the copies it
stored for a retry or as a dead letter (with the group and the retry count), and which groups
committed an offset past it (those consumed it). What it cannot know: which consumer of a
group got each delivery, deliveries it served that were not committed, and what the
application did with it.</p>
{% endblock %}
"""

BROWSE = """\
{% extends "layout" %}
{% from "message_rows" import rows %}
{% block body %}
<p>{% if high > low %}{{ high - low }} messages stored, offsets {{ low }} to {{ high - 1 }};
showing from offset {{ offset }}:{% else %}No messages stored (the next gets offset {{ high
}}).{% endif %}</p>
<form method="get" action="/topics/{{ topic | urlencode }}/queues/{{ queue_id }}">
<label>offset <input name="offset" type="number" value="{{ offset }}"></label>
<button type="submit">go</button>
{% if previous is not none %}<a href="?offset={{ previous }}">previous</a>{% endif %}
{% if next is not none %}<a href="?offset={{ next }}">next</a>{% endif %}
<a href="/topics/{{ topic | urlencode }}">back to {{ topic }}</a>
</form>
{% if found %}{{ rows(found, False) }}{% else %}<p>no messages from offset {{ offset }}</p>
{% endif %}
{% endblock %}
"""

DLQ = """\
{% extends "layout" %}
{% block body %}
{% if found %}
<p>{{ found | length }} dead letter(s) not resent yet{% if found | length >= listed %} (the
first {{ listed }} shown){% endif %}, oldest first. A resend sends them back to their
original topic in order, each once.</p>
<table>
<tr><th>offset</th><th>origin</th><th>id</th><th>sharding key</th><th>keys</th><th>tries</th>
<th>stored</th><th>body</th></tr>
{% for m in found %}
<tr><td class="n">{{ m.offset }}</td><td>{{ m.origin or "?" }}</td>
<td class="id"><a href="/messages/{{ m.msg_id | urlencode }}">{{ m.msg_id }}</a></td>
<td>{{ m.sharding_key or "-" }}</td><td>{{ m.key_list | join(", ") or "-" }}</td>
<td class="n">{{ m.reconsume_times }}</td><td>{{ m.stored_ms | ms }}</td>
<td>{{ m.preview }}</td></tr>
{% endfor %}
</table>
<form method="post" action="/groups/{{ group | urlencode }}/dlq/resend" class="inline">
<input type="hidden" name="count" value="one">
<button type="submit">resend the oldest…</button></form>
<form method="post" action="/groups/{{ group | urlencode }}/dlq/resend" class="inline">
<input type="hidden" name="count" value="all">
<button type="submit">resend all…</button></form>
{% else %}<p>No dead letters to resend.</p>{% endif %}
<p><a href="/groups/{{ group | urlencode }}">back to {{ group }}</a></p>
{% endblock %}
"""

CONFIRM_RESEND = """\
{% extends "layout" %}
{% block body %}
<p>Send {{ "this dead letter" if pending | length == 1 else "these " ~ (pending | length) ~
 " dead letters" }} of group <b>{{ group }}</b> back to {{ "its" if pending | length == 1
 else "their" }} original topic, in order? Each is sent once.</p>
<table><tr><th>offset</th><th>origin</th><th>id</th><th>body</th></tr>
{% for m in pending %}<tr><td class="n">{{ m.offset }}</td><td>{{ m.origin or "?" }}</td>
<td class="id">{{ m.msg_id }}</td><td>{{ m.preview }}</td></tr>{% endfor %}
</table>
<form method="post" action="/groups/{{ group | urlencode }}/dlq/resend">
<input type="hidden" name="count" value="{{ count }}">
<input type="hidden" name="confirm" value="yes">
<button type="submit">yes, resend</button>
<a href="/groups/{{ group | urlencode }}/dlq">no, go back</a>
</form>
{% endblock %}
"""

RESEND_DONE = """\
{% extends "layout" %}
{% block body %}
<table><tr><th>dead letter offset</th><th>sent to</th><th>id</th><th>body</th></tr>
{% for m in resent %}<tr><td class="n">{{ m.offset }}</td><td>{{ m.origin or m.topic }}</td>
<td class="id">{{ m.msg_id }}</td><td>{{ m.preview }}</td></tr>{% endfor %}
</table>
<p><a href="/groups/{{ group | urlencode }}/dlq">back to the dead letters of {{ group }}</a></p>
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
                "message_rows": MESSAGE_ROWS,
                "search": SEARCH,
                "message_page": MESSAGE_PAGE,
                "browse": BROWSE,
                "dlq": DLQ,
                "confirm_resend": CONFIRM_RESEND,
                "resend_done": RESEND_DONE,
            }
        ),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
    )
    env.filters.update(size=_size, duration=_duration, retention=_retention, ms=_ms)
    return env
