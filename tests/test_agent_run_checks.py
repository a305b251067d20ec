"""The agent_run benchmark's answer checks: facts found in the forms answers write them."""

import datetime
from zoneinfo import ZoneInfo

from agent_run import CHANGES, NOW, _converted, check, requests_and_checks, tools_called
from agent_session import _git_repository

from nexus_mlx.agent.loop import AgentRun, Execution

TOKYO = ZoneInfo("Asia/Tokyo")
MOMENT = datetime.datetime(2026, 12, 2, 5, 0, 32, tzinfo=TOKYO)


def test_clock_time_in_words_and_in_iso_datetimes():
    expect = {"tokyo_time_at": MOMENT}
    for answer in ("It is 05:00 in Tokyo.", "It was 5:01 am there.",
                   '{"datetime": "2026-12-02T05:00:32+09:00"}', "at 4:58"):
        assert check(answer, expect, MOMENT)["Tokyo time at the commit"], answer


def test_am_and_pm_decide_the_hour():
    expect = {"tokyo_time_at": MOMENT}  # 05:00 in Tokyo
    for right in ("5:00 AM", "5:00:32 a.m.", "05:00", "at 5:00"):
        assert check(right, expect, MOMENT)["Tokyo time at the commit"], right
    for wrong in ("5:00 PM", "5:00:32 pm", "17:00"):
        assert not check(wrong, expect, MOMENT)["Tokyo time at the commit"], wrong
    evening = {"tokyo_time_at": MOMENT.replace(hour=17)}
    assert check("5:00 pm", evening, MOMENT)["Tokyo time at the commit"]
    assert not check("05:00", evening, MOMENT)["Tokyo time at the commit"]
    midnight = {"tokyo_time_at": MOMENT.replace(hour=0, minute=5)}
    assert check("12:05 AM", midnight, MOMENT)["Tokyo time at the commit"]
    assert not check("12:05 PM", midnight, MOMENT)["Tokyo time at the commit"]


def test_seconds_and_offsets_are_not_read_as_the_clock_time():
    expect = {"tokyo_time_at": datetime.datetime(2026, 12, 2, 0, 5, tzinfo=TOKYO)}
    # 05:00:32+09:00 holds "00:32" (seconds) and "09:00" (the offset), never 00:05
    assert not check("2026-12-02T05:00:05+09:00", expect, MOMENT)["Tokyo time at the commit"]
    assert not check("at 12:00", expect, MOMENT)["Tokyo time at the commit"]


def test_mentions_are_case_insensitive_and_any_of_needs_one():
    expect = {"contains": ["login.py"], "contains_any": ["19:30", "7:30"]}
    out = check("Added LOGIN.PY; London: 7:30 pm", expect, MOMENT)
    assert out == {"mentions login.py": True, "mentions 19:30 or 7:30": True}
    assert not any(check("nothing here", expect, MOMENT).values())


def test_now_is_any_minute_between_the_request_and_its_answer():
    asked = MOMENT
    answered = MOMENT + datetime.timedelta(minutes=7)
    expect = {"now_in": "Asia/Tokyo"}
    assert check("It is 05:06 in Tokyo", expect, asked, answered)["Asia/Tokyo time now"]
    assert not check("It is 05:06 in Tokyo", expect, asked)["Asia/Tokyo time now"]
    assert not check("It is 05:12 in Tokyo", expect, asked, answered)["Asia/Tokyo time now"]
    # London's clock, not Tokyo's: 05:00 in Tokyo on 2 December is 20:00 in London on the 1st
    london = check("It is 20:03 in London", {"now_in": "Europe/London"}, asked, answered)
    assert london == {"Europe/London time now": True}


def test_the_last_commit_is_dated_far_from_now(tmp_path):
    """"Tokyo time at the commit" must not pass by reading the current time."""
    repo = _git_repository(tmp_path)
    expect = requests_and_checks(repo)[0][1]
    committed = expect["tokyo_time_at"]
    assert committed == datetime.datetime(2025, 3, 14, 15, 48, tzinfo=TOKYO)
    assert expect["contains"] == ["login.py"]
    assert datetime.datetime.now(TOKYO) - committed > datetime.timedelta(days=1)
    assert check("It was 15:48 in Tokyo.", expect, MOMENT)["Tokyo time at the commit"]
    assert not check("It was 15:52 in Tokyo.", expect, MOMENT)["Tokyo time at the commit"]


def test_the_modified_files_answer_names_the_modified_file_and_no_other(tmp_path):
    """Listing every file of the repository must not pass for the one that is modified."""
    repo = _git_repository(tmp_path)
    expect = requests_and_checks(repo)[2][1]
    assert expect == {"contains": ["parser.py"], "excludes": ["README.md", "login.py"],
                      "tools": [CHANGES]}
    assert all(check("Only parser.py is modified.", expect, MOMENT).values())
    listed = check("The files are login.py, parser.py and README.md.", expect, MOMENT)
    assert listed["mentions parser.py"] and not listed["does not name login.py"]
    assert not listed["does not name README.md"]


def test_a_conversion_is_computed_for_today_in_both_clock_forms():
    converted = _converted("18:30", "Europe/Berlin", "America/Los_Angeles")
    today = datetime.datetime.now(ZoneInfo("Europe/Berlin")).replace(hour=18, minute=30)
    there = today.astimezone(ZoneInfo("America/Los_Angeles"))
    assert converted == {there.strftime("%H:%M"), there.strftime("%I:%M").lstrip("0")}
    assert converted in ({"09:30", "9:30"}, {"10:30"}, {"08:30", "8:30"})  # 8-10 h apart


def _run(*executions: tuple[str, bool]) -> AgentRun:
    return AgentRun("", [], "answer", executions=[Execution(name, {}, ok, "", 0.0)
                                                  for name, ok in executions])


def test_each_part_needs_one_of_its_tools_accepted_by_its_server():
    groups = [CHANGES, NOW]
    assert tools_called(_run(("git.git_status", True), ("time.get_current_time", True)), groups)
    assert tools_called(_run(("git.git_diff_unstaged", True), ("time.get_current_time", True),
                             ("git.git_log", True)), groups)
    assert not tools_called(_run(("git.git_status", True)), groups)  # one part left undone
    assert not tools_called(_run(("git.git_status", True), ("time.get_current_time", False)),
                            groups)  # its server refused the call
    assert tools_called(_run(), [])
