"""The writing side (prepare, encode) and the reading side (loaders) share their preset texts through
``fgdata.catalog``; that neither imports the other is checked with the other layer rules in tests/test_code_rules.py."""

from __future__ import annotations


def test_preset_texts_are_one_object_on_both_sides():
    from fgdata.catalog import PRESET_CONSTANTS
    from fgdata.encode.text import neg_prompt_text
    from fgdata.loaders import PRESET_CONSTANTS as loader_presets

    assert loader_presets is PRESET_CONSTANTS
    assert neg_prompt_text("neg_prompt_wan", None) == (PRESET_CONSTANTS["neg_prompt_wan"], "preset:neg_prompt_wan")

