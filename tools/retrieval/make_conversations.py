"""Generate the conversational retrieval corpus (tools/retrieval/conversations.json) from a seed.

Memory as agents actually capture it: multi-session chats between two people (and one between a
developer and a coding agent, terse and note-like), captured one turn per memory (``kind:
context``, one citation, ``valid_time`` = the session's date). Turns are written the way people
write: first person and pronouns instead of names ("she's a beagle"), relative dates ("last
sunday"), typos, slang, and lots of small talk full of the words questions are made of ("what did
you do?"). Questions are asked later, in the third person and by name, as a user or agent would:

- ``single_hop``: the answer is in one turn;
- ``multi_hop``: the answer is spread over several turns (a pronoun turn after the one that names
  the thing, or two sessions: "she got a puppy" ... months later "Biscuit had surgery");
- ``temporal``: "when did ..." (the turn says "last weekend"; the session date answers it);
- ``time_scoped``: the question names a time ("in March", "about two months ago") and the same
  person did the same kind of thing at other times: only the one at that time is relevant;
- ``speaker``: who said or suggested what.

Relative times in questions are placeholders (``{month:D}``, ``{ago:D}`` for D days before the run)
rendered by the harness, because sessions are dated relative to the day the harness runs.
Run: ``python tools/retrieval/make_conversations.py`` (deterministic).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 20261201
OUT = Path(__file__).with_name("conversations.json")

PAIRS = [("Caroline", "Melanie"), ("Jon", "Gina"), ("Tomasz", "Aiko"), ("Priya", "Samir"),
         ("Joanna", "Diego"), ("Hannah", "Yusuf"), ("Marco", "Lena")]
WORK_PAIR = ("Dev", "Agent")

# Small talk: most turns of a real chat. Full of question words and pronouns, few content words,
# and a few topic words (dog, trip, work) that also occur in the turns that matter.
FILLER = [
    "Hey! How have you been?", "Hi! long time no talk", "Good, thanks! What about you?", "Not much, you?",
    "haha yeah", "lol same", "That's so cool!", "Oh wow, really?", "I know, right?", "Totally.",
    "What did you do this weekend?", "Did you do anything fun?", "How was your week?", "How's work going?",
    "Work has been crazy, but good.", "Honestly just tired lately.", "Same old, same old.",
    "That sounds amazing!", "I'm so happy for you!", "Aww, that's sweet.", "Ugh, that sucks. Sorry.",
    "Tell me more!", "What was it like?", "How did that go?", "Where was that again?", "When is it?",
    "Who else was there?", "Why did you decide that?", "Did you like it?", "Is it far from you?",
    "I've been thinking about that too.", "We should catch up more often.", "Talk soon!", "Bye! take care",
    "Gotta run, talk later?", "Sure, anytime.", "Thanks for listening, really.", "Of course! That's what friends are for.",
    "Can't wait to hear how it goes.", "Keep me posted!", "Fingers crossed.", "You deserve it.",
    "How's the family?", "Everyone's fine, thanks for asking.", "The kids are driving me nuts lol",
    "I need a vacation tbh", "Have you been sleeping ok?", "Not really, too much going on.",
    "It was a lot of fun actually.", "It was ok I guess.", "I didn't expect that at all.",
    "What are you up to tonight?", "Probably just staying in.", "The weather has been awful here.",
    "It's finally sunny here!", "Did you see the news?", "No, what happened?", "Never mind, not important.",
    "How's the dog doing?", "Any plans for the summer?", "Not yet, maybe a trip somewhere.",
    "How's your new place?", "Still unpacking boxes haha", "Did you ever try that?", "Not yet but I want to.",
    "What do you think I should do?", "I'd just go for it.", "That's what I was thinking too.",
    "Was it expensive?", "A little, but worth it.", "Do you remember when we did that?", "Of course I do!",
]
WORK_FILLER = [
    "ok", "thanks", "looks good", "can you check again?", "done.", "any update?", "not yet, still looking",
    "what did we decide about that?", "let's do it tomorrow", "why is it failing?", "makes sense",
    "I'll take a look", "which one?", "the one from yesterday", "is that merged?", "yes, merged this morning",
    "wait, what happened there?", "no idea tbh", "let me rerun it", "still red", "green now",
]

# One event: turns by its owner (O) and the other speaker (P), with slot values; questions name
# their evidence by turn index. {o}/{p} are the speakers' names, used only in questions.
EVENTS: list[dict] = [
    {"slots": {"pet": ["puppy", "kitten", "rescue dog"], "name": ["Biscuit", "Pepper", "Luna", "Mochi", "Oscar"],
               "breed": ["beagle", "corgi mix", "tabby", "border collie", "greyhound"]},
     "turns": [("O", ["Guess what, we finally adopted a {pet}!! her name is {name}",
                      "we adopted a {pet} last weekend, meet {name} :)"]),
               ("P", ["No way!! What kind?", "omg congrats! what breed?"]),
               ("O", ["she's a {breed}, about 3 months old. already chewed my shoes lol",
                      "a {breed}. she sleeps like 20 hours a day"])],
     "questions": [("single_hop", "What is the name of {o}'s {pet}?", [0]),
                   ("multi_hop", "What breed is {o}'s pet {name}?", [0, 2]),
                   ("temporal", "When did {o} adopt {name}?", [0])],
     "followup": {"turns": [("O", ["{name} had to have surgery on her leg, she's recovering now",
                                   "poor {name} got sick this week, vet says she'll be fine"])],
                  "questions": [("multi_hop", "What happened to the {pet} {o} adopted?", ["first:0", 0])]}},
    {"slots": {"city": ["Lisbon", "Kyoto", "Montreal", "Oaxaca", "Edinburgh", "Reykjavik", "Seville"],
               "thing": ["the food", "the old town", "a cooking class", "the museums", "a boat tour"]},
     "turns": [("O", ["just got back from {city} yesterday, {thing} was the highlight",
                      "Back from {city}! {thing} was unreal"]),
               ("P", ["jealous!! how long were you there?", "Ahh I've always wanted to go. How was it?"]),
               ("O", ["a week. I'd go back tomorrow honestly", "only 5 days, way too short"])],
     "questions": [("single_hop", "Which city did {o} travel to and enjoy {thing}?", [0]),
                   ("temporal", "When did {o} come back from {city}?", [0]),
                   ("time_scoped", "Where did {o} travel around {month}?", [0])],
     "repeat": True},
    {"slots": {"job": ["a bakery", "the city library", "a climbing gym", "a design agency", "a vet clinic"],
               "role": ["assistant manager", "shift lead", "senior designer", "head of events"]},
     "turns": [("O", ["I started a new job at {job} last week!", "so I got the job at {job}, started monday"]),
               ("P", ["Congrats!! how is it so far?", "That's huge! do you like the people?"]),
               ("O", ["everyone is really nice. the hours are early tho", "love it, way better than my old job"])],
     "questions": [("single_hop", "Where does {o} work now?", [0]),
                   ("temporal", "When did {o} start working at {job}?", [0])],
     "followup": {"turns": [("O", ["got promoted to {role}!! can't believe it", "they made me {role} today"])],
                  "questions": [("multi_hop", "What position does {o} have at {job}?", ["first:0", 0])]}},
    {"slots": {"class": ["pottery", "salsa", "watercolor painting", "japanese", "improv", "woodworking"],
               "day": ["tuesdays", "thursday nights", "saturday mornings"]},
     "turns": [("O", ["I signed up for a {class} class, it's on {day}", "started {class} lessons on {day}!"]),
               ("P", ["that's so you haha", "Ooh fun, is it hard?"]),
               ("O", ["harder than it looks but the teacher is great", "I'm terrible at it but it's relaxing"])],
     "questions": [("single_hop", "What class did {o} sign up for?", [0]),
                   ("single_hop", "On which day is {o}'s {class} class?", [0])]},
    {"slots": {"book": ["The Overstory", "Piranesi", "Educated", "Project Hail Mary", "Circe", "Pachinko"]},
     "turns": [("P", ["you should read {book}, I think you'd love it", "Have you read {book}? it's so good"]),
               ("O", ["adding it to my list!", "ooh no, is it sad?"]),
               ("P", ["a little but it's worth it trust me", "kind of, but beautiful"])],
     "questions": [("speaker", "Who recommended {book} to {o}?", [0]),
                   ("single_hop", "Which book did {p} recommend?", [0])]},
    {"slots": {"race": ["half marathon", "10k", "charity 5k", "triathlon"], "time": ["2 hours 5 min", "52 minutes",
                                                                                   "just under 30 min"]},
     "turns": [("O", ["ran my first {race} last sunday!!", "I did the {race} on saturday, legs are dead"]),
               ("P", ["omg how did it go??", "whoa, what was your time?"]),
               ("O", ["finished in {time}, way better than I hoped", "{time}! not bad for a first one right"])],
     "questions": [("temporal", "When did {o} run the {race}?", [0]),
                   ("multi_hop", "What was {o}'s time in the {race}?", [0, 2])]},
    {"slots": {"rel": ["sister", "brother", "cousin", "best friend"], "rname": ["Maya", "Theo", "Nina", "Raj"],
               "wmonth": ["June", "September", "October", "May"]},
     "turns": [("O", ["my {rel} {rname} is getting married in {wmonth}!", "{rname} just got engaged!! wedding's in {wmonth}"]),
               ("P", ["aww tell them congrats from me", "are you in the wedding party?"]),
               ("O", ["yes I'm giving a speech, terrified lol", "I'm doing the flowers, no pressure haha"])],
     "questions": [("single_hop", "Who is getting married in {o}'s family?", [0]),
                   ("multi_hop", "What is {o} doing at {rname}'s wedding?", [0, 2])]},
    {"slots": {"car": ["used Subaru", "old Volvo", "electric scooter", "cargo bike", "secondhand Prius"]},
     "turns": [("O", ["finally bought a {car}, no more buses!", "we got a {car} this week"]),
               ("P", ["nice! what made you pick that?", "finally lol. is it reliable?"]),
               ("O", ["it was cheap and it's good in snow", "my dad helped me check it out, it's solid"])],
     "questions": [("single_hop", "What vehicle did {o} buy?", [0])]},
    {"slots": {"injury": ["sprained my ankle", "hurt my back", "broke my wrist", "pulled a hamstring"],
               "sport": ["volleyball", "bouldering", "soccer", "skiing"]},
     "turns": [("O", ["so I {injury} playing {sport} :(", "{injury} at {sport} on friday, ugh"]),
               ("P", ["oh no!! are you ok?", "ouch, how long til you're better?"]),
               ("O", ["doctor said 6 weeks, no {sport} til then", "gonna be fine, just annoying"])],
     "questions": [("single_hop", "How did {o} get injured?", [0]),
                   ("temporal", "When did {o} get hurt playing {sport}?", [0])]},
    {"slots": {"dish": ["lasagna", "ramen from scratch", "sourdough", "a lemon tart", "pierogi", "mole"],
               "who": ["my grandma", "my neighbour", "a youtube video", "my mom"]},
     "turns": [("O", ["made {dish} last night, recipe from {who}", "I tried making {dish} this weekend!"]),
               ("P", ["save me some!!", "how did it turn out?"]),
               ("O", ["burned the first batch but the second was perfect", "honestly the best thing I've cooked"])],
     "questions": [("single_hop", "What did {o} cook?", [0]),
                   ("time_scoped", "What did {o} cook {ago}?", [0])],
     "repeat": True},
    {"slots": {"show": ["a jazz concert", "the Taylor Swift show", "a comedy night", "an opera", "a drag show"],
               "with": ["my roommate", "my coworkers", "my dad", "my partner"]},
     "turns": [("O", ["went to {show} with {with}, so much fun", "saw {show} yesterday with {with}!"]),
               ("P", ["jealous! was it loud?", "ahh I wanted to go to that!"])],
     "questions": [("single_hop", "Who did {o} go to {show} with?", [0]),
                   ("time_scoped", "Which show did {o} go to in {month}?", [0])],
     "repeat": True},
    {"slots": {"move": ["a flat near the river", "a tiny house outside town", "my aunt's old apartment",
                        "a place with a garden"]},
     "turns": [("O", ["we're moving! found {move}", "big news, signing the lease for {move} tomorrow"]),
               ("P", ["yay! I can help you pack boxes if you want", "do you need help with boxes?"]),
               ("O", ["end of the month, I'll bribe you with pizza", "yes pls lol, next saturday?"])],
     "questions": [("single_hop", "Where is {o} moving to?", [0]),
                   ("speaker", "Who offered to help {o} with moving boxes?", [1])]},
    {"slots": {"advice": ["therapy", "journaling every night", "a meditation app", "taking a break from social media"],
               "issue": ["stress at work", "not sleeping", "feeling anxious", "the breakup"]},
     "turns": [("O", ["I've been struggling with {issue} lately", "honestly {issue} is getting to me"]),
               ("P", ["have you tried {advice}? it helped me a lot", "maybe try {advice}? worked for me"]),
               ("O", ["maybe I will, thanks", "I'll give it a shot"])],
     "questions": [("speaker", "What did {p} suggest to {o} for {issue}?", [0, 1]),
                   ("single_hop", "What has {o} been struggling with?", [0])]},
    {"slots": {"plant": ["tomatoes", "a lemon tree", "basil and mint", "sunflowers", "strawberries"]},
     "turns": [("O", ["my {plant} are finally growing!! first time gardening", "planted {plant} on the balcony"]),
               ("P", ["green thumb!", "send pics!!"])],
     "questions": [("single_hop", "What is {o} growing?", [0])]},
    {"slots": {"vol": ["the animal shelter", "a food bank", "the youth center", "a beach cleanup"]},
     "turns": [("O", ["started volunteering at {vol} on weekends", "I volunteer at {vol} now, every other sunday"]),
               ("P", ["that's really kind of you", "how did you get into that?"]),
               ("O", ["a friend dragged me along and I loved it", "I wanted to give back, you know?"])],
     "questions": [("single_hop", "Where does {o} volunteer?", [0]),
                   ("single_hop", "Why did {o} start volunteering?", [0, 2])]},
    {"slots": {"instr": ["guitar", "piano", "the ukulele", "drums", "violin"], "song": ["Wonderwall", "Clair de Lune",
                                                                                      "Hallelujah", "Riptide"]},
     "turns": [("O", ["been learning {instr}, I can almost play {song}", "picked up {instr} again after like 10 yrs"]),
               ("P", ["play it for me next time!", "whoa, self taught?"]),
               ("O", ["youtube + my neighbour's kid lol", "I practice every night before bed"])],
     "questions": [("single_hop", "What instrument is {o} learning?", [0])]},
    {"slots": {"exam": ["my nursing exam", "the bar exam", "my driving test", "the CPA exam", "my thesis defense"]},
     "turns": [("O", ["I PASSED {exam}!!!", "so I passed {exam} today"]),
               ("P", ["YESSS I knew you would", "congratulations!!! celebrate tonight!"])],
     "questions": [("single_hop", "What exam did {o} pass?", [0]),
                   ("temporal", "When did {o} pass {exam}?", [0])]},
]

# The work chat: a developer and a coding agent, terse notes. Same shapes, other content.
WORK_EVENTS: list[dict] = [
    {"slots": {"test": ["test_checkout_retry", "the auth integration test", "test_sync_conflicts"],
               "cause": ["a timezone bug on the CI runner", "a race in the fixture teardown",
                         "an unpinned dependency"], "pr": ["#412", "#388", "#509", "#467"]},
     "turns": [("P", ["{test} is flaky again", "why does {test} keep failing on CI?"]),
               ("O", ["found it: {cause}. fix in PR {pr}", "root cause was {cause}, PR {pr} fixes it"])],
     "questions": [("single_hop", "Why was {test} flaky?", [0, 1]),
                   ("single_hop", "Which PR fixed {test}?", [1])]},
    {"slots": {"lib": ["httpx", "polars", "pydantic v2", "SQLAlchemy 2"], "old": ["requests", "pandas",
                                                                              "marshmallow", "raw SQL"]},
     "turns": [("P", ["should we switch from {old} to {lib}?", "thinking of dropping {old}"]),
               ("O", ["agreed: move to {lib}, keep {old} only in the legacy importer",
                      "decision: {lib} for new code, {old} stays in the importer for now"])],
     "questions": [("single_hop", "What did we decide about replacing {old}?", [0, 1]),
                   ("speaker", "Who proposed switching to {lib}?", [0])]},
    {"slots": {"svc": ["the billing worker", "the search API", "the nightly export"], "fix": [
        "raised the pool to 64 and added a 5s timeout", "added an index on user_id", "batched the writes by 500"]},
     "turns": [("P", ["{svc} was super slow this morning", "{svc} timed out again"]),
               ("O", ["{fix}; p99 back under 200ms", "I {fix}, should be ok now"])],
     "questions": [("single_hop", "How was {svc} made faster?", [1]),
                   ("time_scoped", "What did the agent change in {svc} in {month}?", [1])],
     "repeat": True},
    {"slots": {"who": ["Mike", "Sofia", "Ken", "Ana"], "area": ["the release notes", "on-call next week",
                                                              "the DB migration", "the design review"]},
     "turns": [("P", ["{who} will handle {area}", "fyi {who} owns {area} now"]),
               ("O", ["noted, I'll tag {who} on related PRs", "ok, assigning {area} to {who}"])],
     "questions": [("single_hop", "Who is responsible for {area}?", [0])]},
]

TYPO_RATE = 0.12


def typo(rng: random.Random, text: str) -> str:
    """One realistic slip in a longer word: swapped, dropped or doubled letter."""
    words = text.split(" ")
    long = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()]
    if not long:
        return text
    i = rng.choice(long)
    w = words[i]
    j = rng.randrange(1, len(w) - 1)
    kind = rng.randrange(3)
    if kind == 0:
        w = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    elif kind == 1:
        w = w[:j] + w[j + 1:]
    else:
        w = w[:j] + w[j] + w[j:]
    words[i] = w
    return " ".join(words)


def build_conversation(rng: random.Random, cid: str, speakers: tuple[str, str], events: list[dict],
                       filler: list[str], n_sessions: int, per_session: tuple[int, int]) -> tuple[dict, list[dict]]:
    sessions: list[dict] = []
    questions: list[dict] = []
    days = rng.randint(330, 420)
    pending_followups: list[tuple[int, dict, dict, str, str, int]] = []  # (due session, event, values, o, p, first turn)
    used_slots: dict[tuple[int, str], set[str]] = {}
    once: set[tuple[int, str]] = set()

    def pick_values(ei: int, ev: dict, owner: str) -> dict:
        # A repeated event by the same owner takes other values each time (distinct trips, dishes).
        values = {}
        for k, opts in ev["slots"].items():
            taken = used_slots.setdefault((ei, owner + k), set())
            free = [v for v in opts if v not in taken] or opts
            values[k] = rng.choice(free)
            taken.add(values[k])
        return values

    def render(template: str, values: dict, o: str, p: str, session_days: int) -> str:
        # {month}/{ago} stay placeholders with the session's age: the harness renders them.
        return template.format(**values, o=o, p=p, month=f"{{month:{session_days}}}",
                               ago=f"{{ago:{session_days}}}")

    for s in range(n_sessions):
        if s:
            days -= rng.randint(8, 35)
        days = max(days, 2)
        turns: list[dict] = []

        def say(speaker: str, text: str, turns: list[dict] = turns) -> int:
            if rng.random() < TYPO_RATE:
                text = typo(rng, text)
            if rng.random() < 0.2:
                text = text[0].lower() + text[1:]
            turns.append({"speaker": speaker, "text": text})
            return len(turns) - 1

        lo, hi = per_session
        first = rng.randrange(2)
        for _ in range(rng.randint(2, 3)):
            say(speakers[(len(turns) + first) % 2], rng.choice(filler))
        due = [f for f in pending_followups if f[0] == s]
        pending_followups = [f for f in pending_followups if f[0] != s]
        n_events = rng.randint(2, 4)
        chosen = [rng.randrange(len(events)) for _ in range(n_events)]
        plans: list[tuple[str, int | None, dict, dict, str, str, int | None]] = []
        for ei in chosen:
            ev = events[ei]
            owners = [i for i in range(2) if ev.get("repeat") or (ei, speakers[i]) not in once]
            if not owners:
                continue
            owner_i = rng.choice(owners)
            o, p = speakers[owner_i], speakers[1 - owner_i]
            once.add((ei, o))  # a one-off event (a job, a pet) happens once per person: questions stay unambiguous
            plans.append(("event", ei, ev, pick_values(ei, ev, o), o, p, None))
        for _due, ev, values, o, p, first_turn in due:
            plans.append(("followup", None, ev, values, o, p, first_turn))
        rng.shuffle(plans)
        for kind, _ei, ev, values, o, p, first_turn in plans:
            body = ev["followup"] if kind == "followup" else ev
            idx = []
            for who, variants in body["turns"]:
                speaker = o if who == "O" else p
                idx.append(say(speaker, render(rng.choice(variants), values, o, p, days)))
                if rng.random() < 0.35:  # a reaction in between: answers are rarely adjacent
                    say(p if who == "O" else o, rng.choice(filler))
            for qtype, qt, ev_idx in body["questions"]:
                evidence = []
                for e in ev_idx:
                    if isinstance(e, str):  # "first:N": turn N of the original event
                        evidence.append(first_turn[int(e.split(":")[1])])
                    else:
                        evidence.append(f"{cid}:s{s + 1}:t{idx[e] + 1}")
                questions.append({"type": qtype, "workspace": cid, "text": render(qt, values, o, p, days),
                                  "evidence": evidence, "_event": (id(ev), o, s)})
            if kind == "event" and "followup" in ev and s + 1 < n_sessions:
                first_ids = [f"{cid}:s{s + 1}:t{i + 1}" for i in idx]
                pending_followups.append((rng.randint(s + 1, n_sessions - 1), ev, values, o, p, first_ids))
            for _ in range(rng.randint(1, 3)):
                say(speakers[rng.randrange(2)], rng.choice(filler))
        while len(turns) < rng.randint(lo, hi):
            say(speakers[len(turns) % 2], rng.choice(filler))
        sessions.append({"session": s + 1, "days_ago": days, "turns": turns})
    # A time-scoped question needs the same person doing the same kind of thing in another
    # session (the time is what tells them apart); otherwise it is dropped.
    sessions_of: dict[tuple[int, str], set[int]] = {}
    for q in questions:
        ev_id, o, s = q["_event"]
        sessions_of.setdefault((ev_id, o), set()).add(s)
    kept = []
    for q in questions:
        ev_id, o, _s = q.pop("_event")
        if q["type"] != "time_scoped" or len(sessions_of[(ev_id, o)]) > 1:
            kept.append(q)
    return {"id": cid, "speakers": list(speakers), "sessions": sessions}, kept


def main() -> None:
    rng = random.Random(SEED)
    conversations, questions = [], []
    for i, pair in enumerate(PAIRS):
        conv, qs = build_conversation(rng, f"conv-{i + 1}", pair, EVENTS, FILLER, n_sessions=rng.randint(12, 16),
                                      per_session=(16, 26))
        conversations.append(conv)
        questions.extend(qs)
    conv, qs = build_conversation(rng, "work-notes", WORK_PAIR, WORK_EVENTS, WORK_FILLER, n_sessions=14,
                                  per_session=(8, 14))
    conversations.append(conv)
    questions.extend(qs)
    for n, q in enumerate(questions):
        q["id"] = f"q{n + 1:04d}"
    turns = sum(len(s["turns"]) for c in conversations for s in c["sessions"])
    doc = {"seed": SEED, "generator": "tools/retrieval/make_conversations.py", "conversations": conversations,
           "questions": questions}
    OUT.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    by_type: dict[str, int] = {}
    for q in questions:
        by_type[q["type"]] = by_type.get(q["type"], 0) + 1
    print(f"{len(conversations)} conversations, {turns} turns, {len(questions)} questions {by_type} -> {OUT}")


if __name__ == "__main__":
    main()
