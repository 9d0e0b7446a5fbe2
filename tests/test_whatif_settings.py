"""``PYTORCH_ALLOC_CONF`` strings read as torch's ``ConfigTokenizer`` and
``AcceleratorAllocatorConfig`` read them: accepted exactly when torch accepts them, and
read to the same values, quirks included.

Needs neither IPython nor a GPU: on the GPU machine ``pytest tests/test_whatif_settings.py``
checks the list against its torch too.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from gpumem_nb.whatif.config import SettingError, parse_settings
from gpumem_nb.whatif.rules import round_size

MiB = 1 << 20


# What CPU torch 2.13's parser did with each (torch._C._accelerator_setAllocatorSettings);
# the test below checks the list against the torch installed, where there is one.
TORCH_ACCEPTS = {
    "expandable_segments:True": True,
    "expandable_segments:true": False,  # toBool: True or False only
    "max_split_size_mb:64abc": True,  # stoull reads the digits it starts with
    "max_split_size_mb:+64": True,
    "max_split_size_mb:-1": True,  # stoull wraps a minus around: 2**64 - 1
    "max_split_size_mb:18446744073709551615": True,
    "max_split_size_mb:18446744073709551616": False,  # out of a 64-bit range
    "max_split_size_mb:" + "9" * 5000: False,  # once a ValueError (int's digit limit)
    "max_split_size_mb:" + "0" * 5000 + "64": True,
    "max_split_size_mb:²": False,  # str.isdigit said yes, int() no
    "max_split_size_mb:٦٤": False,
    "max_split_size_mb:6 4": True,  # whitespace vanishes inside a value too
    "max_split_size_mb:64\t,\nexpandable_segments:True": True,
    "max_split_size_mb[64": True,  # the separator is never checked
    "max_split_size_mb:64:expandable_segments:True": True,
    "max_split_size_mb": False,
    "roundup_power2_divisions:" + str(2**100): False,
    "roundup_power2_divisions:9223372036854775808": True,
    "roundup_power2_divisions:-1": False,
    "roundup_power2_divisions:[" + "9" * 5000 + ":4]": False,
    "roundup_power2_divisions:[64abc:2,>:4]": True,
    "roundup_power2_divisions:[0:2]": False,
    "roundup_power2_divisions:[64:2": False,
    "garbage_collection_threshold:0.5abc": True,  # stod reads the number it starts with
    "garbage_collection_threshold:0x0.8p0": True,
    "garbage_collection_threshold:.5": True,
    "garbage_collection_threshold:1e-320": False,  # out of a double's range
    "garbage_collection_threshold:nan": False,
    "garbage_collection_threshold:1_0": False,
    "large_segment_size_mb:10": False,
    "large_segment_size_mb:11": True,
    "large_segment_size_mb:" + "9" * 30: False,
    "large_segment_size_mb:64,max_split_size_mb:32": False,
    "expandable_segments:True,": True,
}


def _accepts(text: str) -> bool:
    try:
        parse_settings(text)
    except SettingError:
        return False
    return True


@pytest.mark.parametrize("text", list(TORCH_ACCEPTS), ids=lambda t: t[:50])
def test_a_setting_is_accepted_exactly_when_torch_accepts_it(text):
    assert _accepts(text) == TORCH_ACCEPTS[text]


def test_settings_read_as_torch_reads_their_values():
    assert parse_settings("max_split_size_mb:64abc").max_split_size == 64 * MiB
    assert parse_settings("max_split_size_mb:6 4").max_split_size == 64 * MiB
    # Clamped to SIZE_MAX / 1 MiB MiB, as torch does: not "unset", so oversize blocks can
    # still be released before an OOM.
    assert parse_settings("max_split_size_mb:-1").max_split_size == ((1 << 44) - 1) * MiB
    assert parse_settings("garbage_collection_threshold:0x0.8p0").garbage_collection_threshold \
        == 0.5
    s = parse_settings("max_split_size_mb[64:expandable_segments:True")
    assert (s.max_split_size, s.expandable_segments) == (64 * MiB, True)
    assert parse_settings("roundup_power2_divisions:[64abc:2,>:4]").roundup_power2_divisions \
        == (2,) * 7 + (4,) * 9
    # 512 * 2**63 wraps to 0 in size_t: every size then rounds up to the next power of two.
    huge = parse_settings("roundup_power2_divisions:9223372036854775808")
    assert round_size(3 * MiB, huge.roundup_power2_divisions) == 4 * MiB


@pytest.mark.gpu  # needs torch: the GPU machine's run has it, CI does not
def test_the_accept_list_is_the_one_the_installed_torch_parser_gives():
    # In a child process: this one keeps the fake torch. On a CPU build torch has no CUDA
    # keys to check, which is why every key above is one its common parser reads.
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    code = ("import json, sys, torch\n"
            "parse = getattr(torch._C, '_accelerator_setAllocatorSettings', None)\n"
            "out = {}\n"
            "for t in json.load(sys.stdin) if parse else ():\n"
            "    try:\n"
            "        parse(t); out[t] = True\n"
            "    except Exception:\n"
            "        out[t] = False\n"
            "print(json.dumps(out if parse else None))\n")
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(list(TORCH_ACCEPTS)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    told = json.loads(done.stdout.splitlines()[-1])
    if told is None:
        pytest.skip("this torch has no allocator settings parser to ask")
    assert told == TORCH_ACCEPTS
