"""The compile command's build-option flags, as ``BuildOptions`` spells them
(``offline_compiler/options.py``): each flag's spelling, help and parsing, and the API keyword
its value is. The table is imported when a parser is made, not with the CLI: it lives beside
the pipeline, which the CLI loads only once a command needs it."""
from __future__ import annotations


def add_option_flags(parser, *keywords: str) -> None:
    """The flags of these API keywords, in this order (the help's)."""
    from pypto_offline.offline_compiler.options import KEYWORDS

    for keyword in (KEYWORDS[name] for name in keywords):
        parser.add_argument(*keyword.flags, dest=keyword.name, help=keyword.help,
                            **keyword.argparse)


def option_keywords(args) -> dict:
    """``api.compile``'s keywords that the flags give: a flag left out (None) leaves its
    keyword to the API's default."""
    from pypto_offline.offline_compiler.options import KEYWORDS

    return {name: getattr(args, name) for name, keyword in KEYWORDS.items()
            if keyword.flags and getattr(args, name) is not None}
