"""Report sections of the agent-facing benchmarks: live sessions, the server, the agent loop,
function calling and the routing / IR levers.

Contract: each ``*_section(d)`` turns one result JSON (the contract in ``bench/<name>.py``'s
docstring) into markdown lines; missing keys render as ``n/a`` and no renderer raises on partial
JSON. These benchmarks have no paper table, so the lines hold measured values and the targets
the result records. It reads no files and does not order sections (:mod:`report` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from report_format import fmt, fmt_ci, get, mapping, records, sort_by, sorted_keys, table

SESSION_CLASSES = ("append", "tools", "delete", "edit", "deep")
SERVER_CLASSES = ("append", "tools", "delete", "edit", "edits")


def _dict(obj: Any, *path: Any) -> dict[str, Any]:
    """``obj[path...]`` when it is a JSON object, else an empty dict."""
    value = get(obj, *path)
    return value if isinstance(value, dict) else {}


def _by_class(summary: dict[str, Any], classes: tuple[str, ...],
              cells: Callable[[dict[str, Any]], list[str]]) -> list[list[str]]:
    """One row per arm (or server) and edit class of ``summary[arm][class]``."""
    return [[arm, edit, *cells(c)] for arm in sorted_keys(summary) for edit in classes
            if isinstance(c := get(summary, arm, edit), dict)]


def session_section(d: dict[str, Any]) -> list[str]:
    """``agent_session``: TTFT and fidelity by arm and edit class."""
    rows = _by_class(mapping(d, "summary"), SESSION_CLASSES, lambda c: [
        fmt(c.get("n")), fmt(c.get("ttft_ms"), ".1f"), fmt(c.get("speedup_vs_prefix"), ".2f"),
        fmt(c.get("speedup_incl_guard"), ".2f"),
        fmt(c.get("agree16"), ".3f"), _calls(c), fmt(c.get("kl"), ".4f"),
        fmt(c.get("heal_ms"), ".1f"), fmt(c.get("guarded"), ".2f")])
    head = [
        "TTFT: the step from the previous state to the first token's logits; speed-up over the "
        "prefix cache (mlx-lm's prompt cache); agree16: first 16 greedy tokens equal to "
        "re-prefill's; deep: non-append requests at depth >= 1,024 tokens; heal: idle-time "
        "recompute of stale rows after a reply, off the critical path; calls identical: the "
        "first tool call equal to re-prefill's, over the requests (in brackets) where either "
        "wrote one (n/a: a run from before calls were compared, whose figure compared no "
        "calls); guarded: the share of requests whose close-call guard healed the stale rows "
        f"(the run's guard: {fmt(d.get('guard'))} nats; n/a: off or a run from before it); "
        "with guard heals: the speed-up when the guard's heals while decoding are added to "
        "TTFT (n/a: a result from before it was recorded).", ""]
    return head + table(["arm", "edit class", "n", "TTFT ms", "vs prefix",
                         "with guard heals", "agree16",
                         "calls identical", "KL", "heal ms", "guarded"], rows)


def _calls(c: dict[str, Any]) -> str:
    """Call agreement with the number of requests it compares; n/a for a run that did not count."""
    if "calls_compared" not in c:
        return "n/a"
    return f"{fmt(c.get('calls_identical'), '.3f')} ({fmt(c.get('calls_compared'))})"


def server_section(d: dict[str, Any]) -> list[str]:
    """``server``: TTFT over HTTP vs mlx_lm.server, constraints, concurrency."""
    rows = _by_class(_dict(d, "replay", "summary"), SERVER_CLASSES, lambda c: [
        fmt(c.get("n")), fmt(c.get("ttft_ms_mean"), ".1f"), fmt_ci(c.get("ttft_ms_ci"), ".1f"),
        fmt(c.get("ttft_speedup_vs_mlx_lm"), ".2f"), fmt(c.get("agree_with_mlx_lm"), ".3f"),
        fmt(c.get("cached_tokens_mean"), ".0f")])
    out = table(["server", "edit class", "n", "TTFT ms (mean)", "95% CI",
                                  "vs mlx_lm.server", "reply = mlx_lm.server's",
                                  "cached tokens"], rows)
    answers = []
    for kind in sorted_keys(mapping(d, "constraints")):
        for name, answer in sorted(_dict(d, "constraints", kind, "answers").items()):
            if isinstance(answer, dict):
                answers.append([kind, name, fmt(answer.get("honoured")),
                                fmt(str(answer.get("detail", ""))[:80])])
    if answers:
        out += ["Constraint requests (both servers' answers are in the JSON):", ""]
        out += table(["request", "server", "honoured", "detail"], answers)
    conc = mapping(d, "concurrency")
    if conc:
        out += [f"Concurrency: {fmt(conc.get('sessions'))} sessions x "
                f"{fmt(conc.get('requests_per_session'))} requests, {fmt(conc.get('errors'))} "
                f"errors; latency p50 {fmt(conc.get('latency_ms_p50'), '.0f')} ms, p99 "
                f"{fmt(conc.get('latency_ms_p99'), '.0f')} ms; peak pool cache "
                f"{fmt((conc.get('peak_cache_bytes') or 0) / 2**20, '.1f')} MiB of "
                f"{fmt((conc.get('cache_budget_bytes') or 0) / 2**20, '.0f')} MiB; RSS growth "
                f"{fmt((conc.get('rss_growth_bytes') or 0) / 2**20, '.1f')} MiB.", ""]
    return out


def _verdict(call: dict[str, Any]) -> str:
    """How a recorded call ended, for the calls column ("" when its server accepted it)."""
    if call.get("ok"):
        return ""
    return " (not approved)" if call.get("approved") is False else " (refused)"


def agent_run_section(d: dict[str, Any]) -> list[str]:
    """``agent_run``: each multi-step request, its calls and whether every check passed; with
    several trials (conversations over new repositories), which trial each row is from."""
    trials = d.get("trials") if isinstance(d.get("trials"), int) else 1
    rows = [([fmt(r.get("trial"))] if trials > 1 else [])
            + [fmt(str(r.get("request", ""))[:70]),
               fmt(", ".join(f"{c.get('name')}{_verdict(c)}"
                             for c in records(r.get("calls"))) or "none"),
               fmt(str(r.get("answer", "")).strip().replace("\n", " ")[:90]),
               fmt(r.get("correct")), fmt(r.get("seconds"), ".0f")]
            for r in records(d.get("records"))]
    over = (f" over {trials} conversations (per conversation: "
            f"{', '.join(fmt(c) for c in d.get('correct_per_trial') or [])})" if trials > 1 else "")
    tools = (f" The tools of every part ran and their servers accepted the calls in "
             f"{fmt(d.get('tools_ok'))} of {fmt(d.get('n'))}; completeness review: "
             f"{'on' if d.get('review') else 'off'}." if "tools_ok" in d else "")
    head = [f"Correct: {fmt(d.get('correct'))} of {fmt(d.get('n'))} requests{over} "
            f"(every check against the servers' own facts passed).{tools}", ""]
    columns = ["request", "calls", "answer", "correct", "seconds"]
    return head + table((["trial"] if trials > 1 else []) + columns, rows)


def function_calling_section(d: dict[str, Any]) -> list[str]:
    """``function_calling``: routing and call accuracy, scored as parsed calls."""
    keys = ("routing_accuracy", "call_accuracy", "argument_accuracy", "schema_valid")
    rows = [[k.replace("_", " "), fmt(d.get(k), ".3f"), fmt_ci(d.get(f"{k}_ci"), ".3f"),
             fmt(get(d, "targets", k), ".2f")] for k in keys]
    rows += [[k.replace("_", " "), fmt(d.get(k), ".3f"), "", fmt(get(d, "targets", k), ".2f")]
             for k in ("specified_argument_accuracy", "json_valid")]
    if "call_accuracy_ungrounded" in d:  # runs since grounding: the same calls, nothing dropped
        rows.append(["call accuracy, ungrounded arguments kept",
                     fmt(d.get("call_accuracy_ungrounded"), ".3f"),
                     fmt_ci(d.get("call_accuracy_ungrounded_ci"), ".3f"), ""])
    latency = mapping(d, "latency_ms")
    head = [f"Queries: {fmt(d.get('n'))}; median latency per query "
                             f"{fmt(get(latency, 'total', 'median'), '.0f')} ms "
                             f"(route {fmt(get(latency, 'route', 'median'), '.0f')} ms).", ""]
    return head + table(["measure", "value", "95% CI", "target"], rows)


def rerank_choice_section(d: dict[str, Any]) -> list[str]:
    """``rerank_choice``: SLB top-1, query likelihood and tool choice per query set."""
    rows = []
    for name, s in mapping(d, "sets").items():
        cell = [fmt(get(s, arm, "accuracy"), ".3f") + " " + fmt_ci(get(s, arm, "ci"), ".2f")
                for arm in ("slb", "query_likelihood", "choice")]
        rows.append([fmt(name) + (" (tuning)" if name == d.get("tune_set") else ""),
                     fmt(s.get("n")), *cell,
                     f"+{fmt(s.get('choice_fixed'))} / -{fmt(s.get('choice_broke'))}",
                     fmt(s.get("escalated"), ".2f"), fmt(s.get("choice_ms"), ".0f")])
    chosen = mapping(d, "chosen")
    head = [f"Tool choice at retrieval weight {fmt(chosen.get('weight'), '.1f')}, "
            f"{'gated' if chosen.get('gated') else 'every query'} (chosen on "
            f"`{fmt(d.get('tune_set'))}` only); k = {fmt(d.get('k'))}.", ""]
    return head + table(["set", "n", "SLB top-1", "query likelihood", "tool choice",
                         "choice vs SLB", "escalated", "choice ms"], rows)


def routing_levers_section(d: dict[str, Any]) -> list[str]:
    """``routing_levers``: first-stage top-1 of each text / fusion method per registry."""
    rows = [[fmt(r.get("method")), f"{fmt(r.get('set'))}@{fmt(r.get('N'))}", fmt(r.get("n")),
             fmt(r.get("top1"), ".3f"), fmt_ci(r.get("top1_ci"), ".3f"), fmt(r.get("top3"), ".3f")]
            for r in sort_by(records(d.get("rows")), "set", "N", "method")]
    chosen = mapping(d, "chosen")
    head = [f"Chosen on `{fmt(chosen.get('on'))}`: `{fmt(chosen.get('method'))}` (tuning top-1 "
            f"{fmt(chosen.get('tuning_top1'), '.3f')}); held out: "
            + ", ".join(f"{k} {fmt(v, '.3f')}" for k, v in sorted(
                mapping(chosen, "held_out").items())) + ".", ""]
    return head + table(["method", "registry@N", "n", "top-1", "95% CI", "top-3"], rows)


def ir_hints_section(d: dict[str, Any]) -> list[str]:
    """``ir_hints``: IR length and call accuracy with and without per-argument format hints."""
    accuracy = mapping(d, "accuracy")
    tokens = mapping(d, "tokens")
    rows = []
    for variant in sorted_keys(accuracy):
        a = accuracy[variant]
        lengths = [f"{name} {fmt(get(per, variant, 'median'), '.0f')}"
                   for name, per in sorted(tokens.items()) if get(per, variant) is not None]
        rows.append([variant, fmt(a.get("n")), fmt(a.get("call_accuracy"), ".3f"),
                     fmt_ci(a.get("call_ci"), ".3f"), fmt(a.get("argument_accuracy"), ".3f"),
                     fmt(", ".join(lengths))])
    return table(["IR variant", "n", "call accuracy", "95% CI",
                                   "argument accuracy", "median IR tokens"], rows)


def guard_sweep_section(d: dict[str, Any]) -> list[str]:
    """``guard_sweep``: each close-call guard threshold replayed over deep edits, per arm."""
    rows = []
    for arm in sorted_keys(mapping(d, "cells")):
        by_guard = _dict(d, "cells", arm)
        for guard in sorted(by_guard, key=_as_float):
            cell = _dict(by_guard, guard)
            deep = _dict(cell, "deep")
            rows.append([arm, guard, _count(deep, "agree16_count", "n"),
                         _count(deep, "calls_count", "calls_compared"),
                         fmt(deep.get("fired"), ".2f"),
                         _per_class(_dict(cell, "speedup_ttft")),
                         _per_class(_dict(cell, "speedup_incl_guard"))])
    checks = [f"{fmt(c.get('arm'))} at {fmt(c.get('guard'))} nats: {fmt(c.get('requests'))} "
              f"requests, fired in both {fmt(c.get('fired_both'))}, only in the run "
              f"{fmt(c.get('fired_only_run'))}, only in the replay "
              f"{fmt(c.get('fired_only_replay'))}; first 16 identical {fmt(c.get('agree16_run'))} "
              f"(run) / {fmt(c.get('agree16_replay'))} (replay)"
              for c in records(d.get("checks"))]
    head = ["Each threshold replayed from one run without the guard (per-token margins): deep "
            "edits (non-append, depth >= 1,024 tokens); speed-ups over the prefix cache per "
            "class (tools / delete / edit), with the heals the guard adds before the first "
            "token (TTFT) and with every heal it adds (TTFT + decode).", ""]
    tail = (["Replay checked against runs made with a guard: " + "; ".join(checks) + ".", ""]
            if checks else [])
    return head + table(["arm", "guard (nats)", "first 16 identical", "calls identical",
                         "fired", "TTFT speed-up", "TTFT + decode heals"], rows) + tail


def _as_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("inf")


def _count(cell: dict[str, Any], hits: str, total: str) -> str:
    return f"{fmt(cell.get(hits))}/{fmt(cell.get(total))}"


def _per_class(speedups: dict[str, Any]) -> str:
    cells = (fmt(speedups.get(c), ".1f") for c in ("tools", "delete", "edit"))
    return " / ".join(c if c == "n/a" else c + "x" for c in cells)


def _median_ci(value: Any, spec: str) -> str:
    """``median [lo, hi]`` from a ``[median, lo, hi]`` list, else ``n/a``."""
    if isinstance(value, list) and len(value) == 3:
        return f"{fmt(value[0], spec)} {fmt_ci(value[1:], spec)}"
    return fmt(None)


def session_copies_section(d: dict[str, Any]) -> list[str]:
    """``session_copies``: session steps with cache copies from slices vs row gathers."""
    rows = [[fmt(row.get("depth")), fmt(row.get("edit")), fmt(row.get("path")),
             _median_ci(row.get("sliced_ms"), ".0f"), _median_ci(row.get("gathered_ms"), ".0f"),
             _median_ci(row.get("gathered_over_sliced"), ".2f")]
            for result in d.get("results") or [] if isinstance(result, dict)
            for row in result.get("rows") or [] if isinstance(row, dict)]
    return [f"{fmt(d.get('trials'))} interleaved rounds per edit; both modes' logits equal, "
            "exact steps equal to a fresh prefill (checked before timing).", ""] + table(
        ["depth", "edit", "path", "sliced ms [95% CI]", "gathered ms [95% CI]",
         "gathered / sliced"], rows)


def lookahead_section(d: dict[str, Any]) -> list[str]:
    """``lookahead``: session replies with copy drafts vs one id per pass."""
    summary = mapping(d, "summary")
    rows = [[name, fmt(s.get("n")), fmt(s.get("identical")), fmt(s.get("decode_ms_plain"), ".0f"),
             fmt(s.get("decode_ms_drafted"), ".0f"), fmt(s.get("speedup"), ".2f"),
             f"{fmt(s.get('accepted'))} / {fmt(s.get('drafted'))}",
             fmt(s.get("ids_per_pass"), ".2f")]
            for name, s in ((k, mapping(summary, k)) for k in sorted_keys(summary))]
    return [f"Drafts of {fmt(d.get('draft'))} ids, replies of up to {fmt(d.get('max_tokens'))} ids,"
            " arms interleaved on fresh sessions; decode time from the first id to the last.",
            ""] + table(["replies", "n", "identical", "one id per pass ms", "drafted ms",
                         "speed-up", "accepted / drafted", "ids per pass"], rows)


def forced_runs_section(d: dict[str, Any]) -> list[str]:
    """``forced_runs``: session replies with forced ids fed in one pass vs one id per pass."""
    turns = mapping(d, "turns")
    rows = [[name, fmt(t.get("same")), fmt(t.get("off_ms"), ".0f"), fmt(t.get("on_ms"), ".0f"),
             f"{fmt(t.get('ratio'), '.2f')} {fmt_ci(t.get('ratio_ci'), '.2f')}",
             f"{fmt(t.get('passes_off'))} -> {fmt(t.get('passes_on'))}", fmt(t.get("ids_on"))]
            for name, t in ((k, mapping(turns, k)) for k in turns)]
    return [f"Replies of up to {fmt(d.get('max_tokens'))} ids on fresh sessions stepped to the "
            f"prompt, {fmt(d.get('trials'))} paired trials; overall ratio "
            f"{fmt(get(d, 'overall', 'ratio'), '.2f')} "
            f"{fmt_ci(get(d, 'overall', 'ratio_ci'), '.2f')}.",
            ""] + table(["turn", "same reply", "one id per pass ms", "forced runs ms",
                         "ratio [95% CI]", "passes", "ids"], rows)


def predicted_outputs_section(d: dict[str, Any]) -> list[str]:
    """``predicted_outputs``: code edits with no drafts, copy drafts and a prediction."""
    arms = mapping(d, "arms")
    rows = [[name, fmt(a.get("identical")), fmt(a.get("ms"), ".0f"),
             f"{fmt(a.get('ratio'), '.2f')} {fmt_ci(a.get('ratio_ci'), '.2f')}",
             f"{fmt(a.get('vs_context'), '.2f')} {fmt_ci(a.get('vs_context_ci'), '.2f')}",
             fmt(a.get("passes")), f"{fmt(a.get('predicted_accepted'))} / "
             f"{fmt(a.get('predicted'))}"]
            for name, a in ((k, mapping(arms, k)) for k in arms)]
    requests = d.get("requests")
    count = len(requests) if isinstance(requests, list) else None
    return [f"{fmt(count)} code edits ({fmt(d.get('ids'))} ids in all), each reply on a fresh "
            "session stepped to the prompt, arms interleaved; ratios: medians over requests "
            "(95% CI over requests); identical: replies whose ids equal the one-id-per-pass "
            "arm's.",
            ""] + table(["arm", "identical", "total ms", "vs one id per pass [95% CI]",
                         "vs copy drafts [95% CI]", "passes", "predicted kept / drafted"], rows)


def server_memory_section(d: dict[str, Any]) -> list[str]:
    """``server_memory``: a long-running server's RSS with and without heap trims and idle
    releases."""
    arms = mapping(d, "arms")

    def thirds(a: dict[str, Any], key: str) -> str:
        values = a.get(key)
        pair = values if isinstance(values, list) and len(values) == 2 else [None, None]
        return f"{fmt(pair[0], '.0f')} -> {fmt(pair[1], '.0f')}"

    rows = [[name, str(a.get("options")), fmt(a.get("rss_first_mib"), ".0f"),
             fmt(a.get("rss_last_mib"), ".0f"), fmt(a.get("peak_rss_mib"), ".0f"),
             thirds(a, "rss_thirds_mib"), thirds(a, "outside_thirds_mib"),
             fmt(a.get("outside_slope_kib_per_turn"), ".0f"),
             f"{fmt(a.get('heap_trims'))} / {fmt(a.get('heap_trim_ms'), '.0f')} ms",
             f"{fmt(get(a, 'idle', 'rss_mib'), '.0f')} / "
             f"{fmt(get(a, 'idle', 'mlx_cache_mib'), '.0f')}",
             f"{fmt(a.get('served'))} / {fmt(a.get('cancelled'))} / {fmt(a.get('failed'))}"]
            for name, a in ((k, mapping(arms, k)) for k in arms)]
    return [f"{fmt(d.get('turns'))} turns of agent traffic per arm (three conversations, the "
            f"server soak's), sampled every {fmt(d.get('every'))}, then once after idling past "
            "the release; thirds: medians of the first and last third of the samples; outside "
            "MLX: RSS less MLX's live arrays and buffer cache. On over off, last-third RSS: "
            f"{fmt(d.get('on_over_off'), '.3f')}; idle RSS: "
            f"{fmt(d.get('idle_on_over_off'), '.3f')}.",
            ""] + table(["arm", "options", "RSS first MiB", "RSS last MiB", "peak MiB",
                         "RSS thirds MiB", "outside MLX thirds MiB", "outside slope KiB/turn",
                         "trims / time", "idle RSS / MLX cache MiB",
                         "served / cancelled / failed"], rows)


def _arm_rows(d: dict[str, Any], arms: tuple[str, ...], time_key: str,
              count_key: str) -> list[list[str]]:
    """A row per arm of a two-arm benchmark: its time (``time_key`` with ``{arm}`` filled in, a
    ``[median, lo, hi]`` list) and its count (``d[count_key][arm]``)."""
    return [[arm, _median_ci(d.get(time_key.format(arm=arm)), ".0f"),
             fmt(get(d, count_key, arm), ".0f")] for arm in arms]


def prompt_scoring_section(d: dict[str, Any]) -> list[str]:
    """``prompt_scoring``: multiple-choice continuations of one context scored fresh vs with
    the prefix reused."""
    rows = _arm_rows(d, ("fresh", "reuse"), "{arm}_ms", "rows_per_item")
    return [f"{fmt(d.get('items'))} HotpotQA items, {fmt(d.get('choices'))} choices each "
            f"(context median {fmt(get(d, 'context_tokens', 'median'), '.0f')} tokens, answers "
            f"{fmt(get(d, 'answer_tokens', 'median'), '.0f')}), scored as the completions API "
            f"scores echo with logprobs. Fresh / reuse: {_median_ci(d.get('speedup'), '.2f')} "
            "(paired); "
            f"scores agree within {fmt(d.get('max_abs_diff'), '.1e')}. The model's accuracy "
            f"(summed / mean answer log probability): {fmt(get(d, 'accuracy', 'sum'), '.2f')} / "
            f"{fmt(get(d, 'accuracy', 'mean'), '.2f')} (chance "
            f"{fmt(get(d, 'accuracy', 'chance'), '.2f')}).",
            ""] + table(["arm", "ms per item [95% CI]", "rows computed per item"], rows)


def session_restore_section(d: dict[str, Any]) -> list[str]:
    """``session_restore``: a conversation resumed after a restart, restored vs cold."""
    rows = _arm_rows(d, ("cold", "restored"), "{arm}_ttft_ms", "cached_tokens")
    mib = d.get("bytes_on_disk")
    return [f"{fmt(d.get('conversations'))} conversations (a HotpotQA question over its ten "
            f"paragraphs, answered in {fmt(d.get('answer_tokens'))} tokens), saved by one server "
            f"at its stop ({fmt(d.get('save_s'), '.2f')} s; {fmt(d.get('files'))} files, the "
            "index included, "
            f"{fmt(mib / 2**20 if isinstance(mib, (int, float)) else None, '.0f')} MiB, "
            f"{fmt(d.get('bytes_per_token'), '.0f')} bytes per cached token), restored by the "
            f"next at its start ({fmt(d.get('restore_s'), '.2f')} s, "
            f"{fmt(d.get('rows_restored'))} rows). The follow-up's TTFT, cold / restored: "
            f"{_median_ci(d.get('speedup'), '.2f')} (paired); the same replies in both.",
            ""] + table(["server", "follow-up TTFT ms [95% CI]", "cached tokens"], rows)


def server_interleave_section(d: dict[str, Any]) -> list[str]:
    """``server_interleave``: a short request during a long streamed reply, replies decoded
    token by token in turns vs one at a time."""
    rows = [[arm, _median_ci(get(d, arm, "short_ttft_ms"), ".0f"),
             _median_ci(get(d, arm, "short_total_ms"), ".0f"),
             _median_ci(get(d, arm, "long_total_ms"), ".0f")]
            for arm in ("interleaved", "fifo")]
    sent = (f"{fmt(d.get('send_after_s'))} s after a new "
            f"{fmt(d.get('long_prompt_tokens'), '.0f')}-token document was sent, during its "
            "prefill," if d.get("during_prefill") else "at its first text")
    return [f"{fmt(d.get('trials'))} trials: a {fmt(d.get('long_tokens'))}-token reply "
            f"streamed, and {sent} a new conversation (a HotpotQA paragraph and its "
            f"question) answered in {fmt(d.get('short_tokens'))} tokens. One at a time / "
            "interleaved, the short request's TTFT: "
            f"{_median_ci(d.get('short_ttft_speedup'), '.2f')}, its whole time: "
            f"{_median_ci(d.get('short_total_speedup'), '.2f')} (paired); the "
            f"long reply takes {_median_ci(d.get('long_total_cost'), '.2f')} as long "
            "interleaved. The same replies on both servers.",
            ""] + table(["server", "short TTFT ms [95% CI]", "short whole ms",
                         "long reply whole ms"], rows)


def server_completions_section(d: dict[str, Any]) -> list[str]:
    """``server_completions``: raw completions of an edited document, ours vs mlx_lm.server."""
    rows = _by_class(mapping(d, "summary"), ("edit", "append"), lambda c: [
        fmt(c.get("n")), fmt(c.get("ttft_ms_mean"), ".0f"), fmt(c.get("ttft_ms_median"), ".0f"),
        f"{fmt(c.get('ttft_speedup_vs_mlx_lm'), '.2f')} {fmt_ci(c.get('ttft_speedup_ci'), '.2f')}",
        fmt(c.get("agree_with_mlx_lm"), ".2f"), fmt(c.get("agree_but_leading_space"), ".2f"),
        fmt(c.get("cached_tokens_mean"), ".0f")])
    return [f"{fmt(d.get('docs'))} documents of {fmt(d.get('paragraphs'))} HotpotQA paragraphs "
            f"(median prompt {fmt(d.get('prompt_tokens_median'), '.0f')} tokens), "
            f"{fmt(d.get('edits'))} changes each (a sentence replaced in the first half, or a "
            f"paragraph appended), each continued for {fmt(d.get('max_tokens'))} tokens; the "
            f"same prompt tokens on every server in {fmt(d.get('prompts_identical_rate'), '.2f')}"
            " of requests.", ""] + table(
        ["server", "class", "n", "TTFT mean ms", "TTFT median ms", "vs mlx_lm.server [95% CI]",
         "same text", "same but leading space", "cached tokens"], rows)
