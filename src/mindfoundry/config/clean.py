"""The `data.clean` section: one settings section per cleaning block, and the per-source overrides.

This is the one definition of every block's parameters and defaults: a block of
:mod:`mindfoundry.data.clean` is built from its section (``Block.settings``) and the pipeline runs
the blocks in the order of :data:`CLEAN_BLOCKS`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, create_model, field_validator

from mindfoundry.config.patterns import probe
from mindfoundry.config.section import Section

#: Advertising lines deleted by the boilerplate block (case-insensitive regular expressions).
DEFAULT_AD_PATTERNS: tuple[str, ...] = (
    "扫码关注",
    "扫描(下方)?二维码",
    "长按(识别)?二维码",
    "关注.{0,8}公众号",
    "点击(阅读|查看)原文",
    "click here to (subscribe|unsubscribe|read more)",
    "subscribe to our newsletter",
)

# Gopher's word n-gram limits (n -> largest share of characters).
GOPHER_TOP_NGRAMS: dict[int, float] = {2: 0.20, 3: 0.18, 4: 0.16}
GOPHER_DUPLICATE_NGRAMS: dict[int, float] = {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}

# Field names are the block constructors' argument names; a ratio or limit set to null disables
# that check.

Ratio = Annotated[float, Field(ge=0, le=1)]
NgramLimits = dict[Annotated[int, Field(ge=1)], Ratio]


class BlockSection(Section):
    """Settings of one cleaning block."""

    enabled: bool = Field(True, description="Run this block (for the sources whose profile includes it).")


class MojibakeConfig(BlockSection):
    """Drop garbled documents (text decoded with the wrong codec); ratios are over non-space characters."""

    max_replacement_ratio: Ratio | None = Field(
        0.01, description="Share of U+FFFD characters (bytes a decoder could not read)."
    )
    max_cjk_mojibake_ratio: Ratio | None = Field(
        0.0, description="Share of characters in 锟斤拷 / 烫烫烫 / 屯屯屯 runs; 0 = any occurrence drops."
    )
    max_latin1_mojibake_ratio: Ratio | None = Field(
        0.01, description="Share of characters in UTF-8-read-as-Latin-1 sequences such as Ã© or â€™."
    )
    max_gbk_mojibake_ratio: Ratio | None = Field(
        0.05, description="Share of characters in runs whose GBK bytes read back as UTF-8 (UTF-8 read as GBK: "
        "中文 -> 涓枃)."
    )
    max_private_use_ratio: Ratio | None = Field(
        0.01, description="Share of private-use characters (font-specific glyphs from PDF extraction)."
    )
    max_unusual_ratio: Ratio | None = Field(
        0.25,
        description="Share of characters no text is written with (control bytes, unassigned code points); "
                    "letters of every script are text.",
    )


class ControlCharsConfig(BlockSection):
    """Normalize line endings to \\n and delete control and zero-width characters (tabs and newlines stay)."""


class NfkcConfig(BlockSection):
    """Unicode normalization: NFC and full-width ASCII folded (default), or NFKC."""

    fold: Literal["width", "compatibility"] = Field(
        "width",
        description="width: NFC, and full-width letters, digits and symbols (Ａ１＃) folded to ASCII; superscripts, "
                    "ligatures and CJK compatibility forms stay as written (2⁵² stays 2⁵²). compatibility: NFKC, which "
                    "also folds those (2⁵² becomes 252).",
    )

    keep_cjk_punctuation: bool = Field(
        True,
        description="Leave Chinese full-width punctuation (，：；！？（）…～) as written instead of folding it to "
                    "ASCII.",
    )


class TimestampsConfig(BlockSection):
    """Delete dates, clock times and "发布时间：…" / "Posted on …" stamps (off by default)."""

    enabled: bool = Field(False, description="Run this block (for the sources whose profile includes it).")
    years: bool = Field(
        True,
        description="Also delete the years 2000-2099 that stand alone ('2023', '2023年'), as the practitioners' recipe "
                    "does; false keeps them.",
    )


class JunkConfig(BlockSection):
    """Delete ad lines and lines that are only a date or time; drop documents that are mostly ads or garbled."""

    ad_lines: bool = Field(
        True,
        description="Delete short lines with contact details (微信/QQ/电话/WhatsApp + an id or number) or two "
                    "promotion phrases (包邮, 限时, free shipping, % off...).",
    )
    stamp_lines: bool = Field(
        True,
        description="Delete lines that are nothing but a date or time, labelled or bracketed "
                    "('发布时间：2023-05-01 12:00', '[2021-03-04]', 'date: ...'); dates inside sentences stay.",
    )
    max_ad_line_share: Ratio | None = Field(
        0.5,
        description="Drop a document when more than this share of its lines are ad lines (an advertisement, not a page "
                    "with an ad).",
    )
    max_rare_cjk_ratio: Ratio | None = Field(
        0.3,
        description="Drop a document when more than this share of its CJK characters is outside GB2312 and Big5's "
                    "common level (random characters; classical poems reach 0.24).",
    )
    max_garbled_word_ratio: Ratio | None = Field(
        0.6,
        description="Drop a document when more than this share of its Latin words mix letters and digits or have no "
                    "vowel (random strings; man pages reach 0.48).",
    )
    min_evidence: int = Field(
        8,
        ge=1,
        description="The garbled-text ratios judge documents with at least this many CJK characters / Latin words.",
    )


class BoilerplateConfig(BlockSection):
    """Delete lines repeated across many documents (counted corpus-wide in a pre-pass) and ad lines."""

    min_documents: int = Field(
        20,
        ge=2,
        description="A line found in at least this many documents is boilerplate. Corpus-wide: set it here, not per "
                    "source.",
    )
    min_line_chars: int = Field(
        20,
        ge=1,
        description="Shorter body lines are never boilerplate (speaker names, 'Exeunt.', closing braces); edge lines "
                    "count at any length. Corpus-wide: set it here.",
    )
    edge_lines: int = Field(
        6,
        ge=0,
        description="The first and last this many non-blank lines of a document are its edges (headers, breadcrumbs, "
                    "footers), counted per source at any length. Corpus-wide: set it here.",
    )
    edge_block_lines: int = Field(
        2,
        ge=1,
        description="An edge line is deleted only inside a run of at least this many consecutive boilerplate edge "
                    "lines (a header is a block; a lone 'Exeunt.' ending most scenes is content).",
    )
    min_source_share: Ratio = Field(
        0.5,
        description="An edge line is boilerplate when it opens or closes at least this share of its source's documents "
                    "(and min_documents of them). Corpus-wide: set it here.",
    )
    body_lines: bool = Field(
        True,
        description="Also delete frequent lines of min_line_chars or more anywhere in a document; the docs profile "
                    "sets false (in manuals a shared line is content).",
    )
    ad_patterns: list[str] = Field(
        list(DEFAULT_AD_PATTERNS),
        description="Case-insensitive regular expressions; a line containing a match is deleted.",
    )

    @field_validator("ad_patterns")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            probe(pattern, "ad_patterns")  # compiles, and does not backtrack catastrophically on adversarial lines
        return patterns


class SymbolRunsConfig(BlockSection):
    """Delete runs of repeated symbols ("=====", "!!!!!!!", "★★★★★☆☆☆☆☆"); drop documents they dominate."""

    min_run: int = Field(
        5, ge=2, description="Shortest run that counts: one symbol repeated, or a repeated pair of symbols (-=-=-=)."
    )
    max_fraction: Ratio | None = Field(
        0.5, description="Drop a document when runs cover more than this share of its non-space characters."
    )


class LengthConfig(BlockSection):
    """Keep documents whose stripped length in characters is within bounds."""

    min_chars: int | None = Field(5, ge=1, description="Shortest document kept.")
    max_chars: int | None = Field(1_000_000, ge=1, description="Longest document kept.")


class ScriptConfig(BlockSection):
    """Keep documents whose share of CJK / Latin letters (among all letters) is within bounds; all off by default, set
    per source."""

    min_cjk_ratio: Ratio | None = Field(
        None, description="Least share of CJK characters among letters (e.g. 0.5 for a Chinese source)."
    )
    max_cjk_ratio: Ratio | None = Field(
        None, description="Largest share of CJK characters among letters (e.g. 0.1 for an English source)."
    )
    min_latin_ratio: Ratio | None = Field(None, description="Least share of Latin letters among letters.")
    max_latin_ratio: Ratio | None = Field(None, description="Largest share of Latin letters among letters.")


#: The languages the identification model names (fastText's lid.176: ISO 639 codes, a few regional ones).
LANGUAGE_CODES: frozenset[str] = frozenset("""
af als am an ar arz as ast av az azb ba bar bcl be bg bh bn bo bpy br bs bxr ca cbk ce ceb ckb co cs cv cy da de diq
dsb dty dv el eml en eo es et eu fa fi fr frr fy ga gd gl gn gom gu gv he hi hif hr hsb ht hu hy ia id ie ilo io is it
ja jbo jv ka kk km kn ko krc ku kv kw ky la lb lez li lmo lo lrc lt lv mai mg mhr min mk ml mn mr mrj ms mt mwl my myv
mzn nah nap nds ne new nl nn no oc or os pa pam pfl pl pms pnb ps pt qu rm ro ru rue sa sah sc scn sco sd sh si sk sl so
sq sr su sv sw ta te tg th tk tl tr tt tyv ug uk ur uz vec vep vi vls vo wa war wuu xal xmf yi yo yue zh""".split())
#: The language of a document with too little prose to tell (digits, symbols, a few words).
UNDETERMINED = "und"


class LanguageConfig(BlockSection):
    """Identify each document's language (fastText's lid.176) and sum its characters per language in the manifest;
    with ``keep``, drop the documents in other languages."""

    keep: list[str] = Field(
        default_factory=list,
        description="Languages kept (ISO 639 codes as fastText's lid.176 names them, e.g. [zh, en]): a document in "
        "another language is dropped; one whose language cannot be told (und) stays. Empty: every "
        "document is only labelled.",
    )
    min_score: Ratio = Field(
        0.5, description="A document is dropped for another language only when the model gives that language at "
        "least this probability; below, it is mixed or unclear and stays.",
    )
    min_letters: int = Field(
        10, ge=1, description="Fewer letters (a CJK character is one) than this: the language is und."
    )
    max_chars: int = Field(
        3000, ge=100, description="Characters read per document, in runs of lines spread over it (bounds the cost "
        "of long documents).",
    )
    zh_script: Literal["keep", "simplified", "traditional"] = Field(
        "keep", description="Convert documents identified as Chinese to simplified or traditional characters "
        "(OpenCC: pip install 'mindfoundry[zh]'); keep leaves them as written.",
    )

    @field_validator("keep")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        unknown = [code for code in v if code not in LANGUAGE_CODES]
        if unknown:
            known = " ".join(sorted(LANGUAGE_CODES))
            raise ValueError(f"unknown language code(s) {', '.join(map(repr, unknown))}: use the ISO 639 codes of "
                             f"fastText's lid.176 (zh, en, ja, de, fr, ru, ...; all: {known})")
        return v


class RepetitionConfig(BlockSection):
    """Gopher repetition rules, measured in units (a CJK character or a word), with char n-grams for Chinese."""

    max_duplicate_line_fraction: Ratio | None = Field(
        0.4,
        description="Share of lines repeating an earlier line (Gopher: 0.3; plays repeat speaker names up to 0.38).",
    )
    max_duplicate_line_char_fraction: Ratio | None = Field(0.2, description="Share of characters in repeated lines.")
    max_duplicate_paragraph_fraction: Ratio | None = Field(
        0.3, description="Share of paragraphs repeating an earlier paragraph."
    )
    max_duplicate_paragraph_char_fraction: Ratio | None = Field(
        0.2, description="Share of characters in repeated paragraphs."
    )
    top_ngrams: NgramLimits | None = Field(
        dict(GOPHER_TOP_NGRAMS),
        description="n -> largest share of characters covered by the most frequent repeated n-gram (Gopher).",
    )
    duplicate_ngrams: NgramLimits | None = Field(
        dict(GOPHER_DUPLICATE_NGRAMS), description="n -> largest share of characters inside repeated n-grams (Gopher)."
    )
    top_ngram_min_units: int = Field(
        50,
        ge=1,
        description="The top n-gram rule applies to documents of at least this many units (one phrase said twice "
                    "dominates a shorter text).",
    )
    ngram_min_units: int = Field(
        100,
        ge=1,
        description="Below this many units (a quote, a stanza) a duplicate n-gram rule drops a document only when more "
                    "than half of it repeats.",
    )
    cjk_chars_per_word: int = Field(
        3,
        ge=1,
        description="For Chinese-dominant documents, n-gram sizes, top_ngram_min_units, ngram_min_units and "
                    "window_units are multiplied by this and counted in characters.",
    )
    window_units: int | None = Field(
        1000,
        ge=50,
        description="N-gram shares are measured in windows of this many units and averaged (Gopher's limits fit a web "
                    "page; over a book every phrase repeats); null = the whole document.",
    )
    min_rest_share: Ratio = Field(
        0.5,
        description="A document that breaks a rule loses its repeated lines and paragraphs and is kept when the rest "
                    "passes and holds at least this share of its characters; else it is dropped.",
    )


class QualityConfig(BlockSection):
    """Gopher quality rules, measured in units so that they apply to Chinese."""

    min_alpha_unit_ratio: Ratio | None = Field(
        0.5, description="Least share of units containing a letter (Gopher: 0.8; news tables are number-heavy)."
    )
    min_mean_word_length: float | None = Field(
        3.0, ge=0, description="Shortest mean word length, Latin-script documents only."
    )
    max_mean_word_length: float | None = Field(
        10.0, ge=0, description="Longest mean word length, Latin-script documents only."
    )
    max_symbol_ratio: float | None = Field(0.1, ge=0, description="Most '#' and ellipses per unit.")
    symbol_ratio_min_units: int = Field(
        20,
        ge=1,
        description="The symbol rule applies to documents of at least this many units (one '……' in a short review is "
                    "not spam).",
    )
    max_bullet_line_ratio: Ratio | None = Field(0.9, description="Largest share of lines starting with a bullet.")
    max_ellipsis_line_ratio: Ratio | None = Field(0.3, description="Largest share of lines ending with an ellipsis.")
    min_rest_share: Ratio = Field(
        0.5,
        description="A document that breaks a line rule (too few alphabetic units, bullets, ellipses) loses the lines "
                    "that break it and is kept when the rest passes and holds at least this share of its characters.",
    )
    line_ratio_min_lines: int = Field(
        3, ge=1, description="The bullet and ellipsis rules apply to documents with at least this many lines."
    )


class CleanConfig(Section):
    """Cleaning blocks, in pipeline order; each source's profile picks which apply (data.sources[].clean)."""

    enabled: bool = Field(True, description="Clean at all; false = every source as with profile 'none'.")
    mojibake: MojibakeConfig = Field(default_factory=MojibakeConfig)
    control_chars: ControlCharsConfig = Field(default_factory=ControlCharsConfig)
    nfkc: NfkcConfig = Field(default_factory=NfkcConfig)
    timestamps: TimestampsConfig = Field(default_factory=TimestampsConfig)
    junk: JunkConfig = Field(default_factory=JunkConfig)
    boilerplate: BoilerplateConfig = Field(default_factory=BoilerplateConfig)
    symbol_runs: SymbolRunsConfig = Field(default_factory=SymbolRunsConfig)
    length: LengthConfig = Field(default_factory=LengthConfig)
    script: ScriptConfig = Field(default_factory=ScriptConfig)
    language: LanguageConfig = Field(default_factory=LanguageConfig)
    repetition: RepetitionConfig = Field(default_factory=RepetitionConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)


#: Names of the block sections of data.clean, in pipeline order.
CLEAN_BLOCKS: tuple[str, ...] = tuple(name for name in CleanConfig.model_fields if name != "enabled")

# Per-source overrides: the same block sections, each optional. Built from CleanConfig so that a new
# block section is overridable per source without a second list to keep in sync.
SourceCleanConfig = create_model(
    "SourceCleanConfig",
    __base__=Section,
    __doc__="How one source is cleaned: a profile picking the blocks, and per-block overrides of data.clean.",
    profile=(
        Literal["auto", "prose", "docs", "code", "none"],
        Field(
            "auto",
            description="Which blocks apply: prose (all), docs (all; boilerplate only at a document's edges), code "
                        "(mojibake, control_chars, length), none; auto = per document, the profile of what it is "
                        "(code, docs or prose), read from its content.",
        ),
    ),
    **{
        name: (
            CleanConfig.model_fields[name].annotation | None,
            Field(
                None,
                description=f"Overrides data.clean.{name} for this source: fields given here win, the others come from "
                            f"data.clean.{name}.",
            ),
        )
        for name in CLEAN_BLOCKS
    },
)
