"""Bugs planted in patched copies of vLLM's own methods (verify/patching.py: edited_copy
compiles the edited source of the installed file in a copy of its module's namespace),
put on a subclass of one manager object's class: the installed package, its files and its
classes stay as they are."""

from __future__ import annotations

from typing import Any

from kvpocket.verify.patching import SourceEdit, edited_copy, rebound

COORDINATOR = "vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator.allocate_new_computed_blocks"
CACHE_FULL_BLOCKS = "vllm.v1.core.block_pool:BlockPool.cache_full_blocks"
ALLOCATE_SLOTS = "vllm.v1.core.kv_cache_manager:KVCacheManager.allocate_slots"

# P/D's guard lost: the blocks an asynchronous KV load will fill are cached at allocation
# (`delay_cache_blocks` ignored), so a prefix hit can take them before the load lands.
CACHE_BEFORE_THE_LOAD = (SourceEdit(
    ALLOCATE_SLOTS,
    """        if delay_cache_blocks:
            return self.create_kv_cache_blocks(new_blocks)
""", ""),)

# vLLM's fix of issue #33775 reverted: every group's local hit blocks are touched before
# any group allocates blocks for external (KV connector) tokens; with one loop, an earlier
# group's allocation can evict a later group's hit block before it is touched.
ONE_PHASE_EXTERNAL_ALLOCATION = (SourceEdit(
    COORDINATOR,
    """                num_external_computed_tokens,
            )
        if num_external_computed_tokens > 0:
            for i, manager in enumerate(self.single_type_managers):
                manager.allocate_external_computed_blocks(""",
    """                num_external_computed_tokens,
            )
            if num_external_computed_tokens > 0:
                manager.allocate_external_computed_blocks("""),)

# A BlockStored announces every new full block's hash, the ones cache_full_blocks skips
# too (null blocks, and blocks sparse sliding-window retention does not keep).
ANNOUNCE_SKIPPED_BLOCKS = (
    SourceEdit(CACHE_FULL_BLOCKS,
               """            if new_hashes is not None:
                new_hashes.append(maybe_convert_block_hash(block_hash))
""", ""),
    SourceEdit(CACHE_FULL_BLOCKS,
               """            if blk.is_null or (block_mask is not None and not block_mask[i]):
                continue
""",
               """            if new_hashes is not None:
                new_hashes.append(maybe_convert_block_hash(new_block_hashes[i]))
            if blk.is_null or (block_mask is not None and not block_mask[i]):
                continue
"""),
)


# vLLM's #47728 undone: the out-of-window prune counts the tokens of steps still in flight
# as computed, so a sliding-window block an in-flight step's attention still reads goes
# back to the pool (and to a KV load's destination) before that step completes.
OPTIMISTIC_PRUNE = (SourceEdit(
    ALLOCATE_SLOTS,
    "            max(0, total_computed_tokens - request.num_in_flight_tokens),",
    "            total_computed_tokens,"),)


def _swap(obj: Any, method: str, edits: tuple[SourceEdit, ...]) -> None:
    cls = type(obj)
    obj.__class__ = type(f"Planted{cls.__name__}", (cls,), {method: edited_copy(edits)})


def one_phase_external_allocation(inst: Any) -> None:
    _swap(inst.mgr.coordinator, "allocate_new_computed_blocks", ONE_PHASE_EXTERNAL_ALLOCATION)


def cache_before_the_load(inst: Any) -> None:
    _swap(inst.mgr, "allocate_slots", CACHE_BEFORE_THE_LOAD)


def optimistic_prune(inst: Any) -> None:
    _swap(inst.mgr, "allocate_slots", OPTIMISTIC_PRUNE)


def frees_at_once(inst: Any) -> None:
    """The scheduler before #45357 (0.23.0): a finished or preempted request's blocks go
    back to the pool at once, its step in flight or not (the target's scheduler side,
    which follows the release it drives)."""
    inst.defers_frees = False


def announce_skipped_blocks(inst: Any) -> None:
    _swap(inst.mgr.block_pool, "cache_full_blocks", ANNOUNCE_SKIPPED_BLOCKS)


UTILS = "vllm.v1.core.kv_cache_utils"

# A LoRA adapter hashed by its name alone: two adapters of one name (different weights)
# share cached blocks.
LORA_NAME_ONLY = (SourceEdit(
    f"{UTILS}:_gen_lora_extra_hash_keys",
    'return [("lora", lora_request.lora_name, lora_request.lora_path)]',
    'return [("lora", lora_request.lora_name)]'),)

# The cache salt left out of the block hash: tenants share cached blocks.
SALT_NOT_HASHED = (SourceEdit(
    f"{UTILS}:generate_block_hash_extra_keys",
    """        if (start_token_idx == 0 and request.cache_salt)""",
    """        if (start_token_idx == 0 and request.cache_salt and False)"""),)


def _hasher(**copies: Any) -> Any:
    """A copy of vLLM's request block hasher calling the given copies of its helpers."""
    import importlib

    utils = importlib.import_module(UTILS)
    extra = utils.generate_block_hash_extra_keys
    if "generate_block_hash_extra_keys" in copies:
        extra = copies.pop("generate_block_hash_extra_keys")
    extra = rebound(extra, **copies)
    return rebound(utils.get_request_block_hasher, generate_block_hash_extra_keys=extra)


def lora_name_only(inst: Any) -> None:
    inst.hasher_factory = _hasher(_gen_lora_extra_hash_keys=edited_copy(LORA_NAME_ONLY))


def salt_not_hashed(inst: Any) -> None:
    inst.hasher_factory = _hasher(generate_block_hash_extra_keys=edited_copy(SALT_NOT_HASHED))


# An image's hash left out of the block hash: prompts of the same placeholder tokens share
# cached blocks whatever their images.
MM_NOT_HASHED = (SourceEdit(
    f"{UTILS}:generate_block_hash_extra_keys",
    "lora_extra_keys + mm_extra_keys + cache_salt_keys + prompt_embeds_keys",
    "lora_extra_keys + cache_salt_keys + prompt_embeds_keys"),)

# An image's position left out of its key: the same image at another offset of a block of
# the same tokens shares the block.
MM_POSITION_IGNORED = (SourceEdit(
    f"{UTILS}:_gen_mm_extra_hash_keys",
    'extra_keys.append(("mm", mm_feature.identifier, offset - start_token_idx))',
    'extra_keys.append(("mm", mm_feature.identifier))'),)

# Prompt embeddings left out of the block hash: their token ids are placeholders (zeros),
# so prompts of different embeddings share cached blocks.
EMBEDS_NOT_HASHED = (SourceEdit(
    f"{UTILS}:_gen_prompt_embeds_extra_hash_keys",
    "    if request.prompt_embeds is None:\n",
    "    if True:\n"),)


def mm_not_hashed(inst: Any) -> None:
    inst.hasher_factory = _hasher(generate_block_hash_extra_keys=edited_copy(MM_NOT_HASHED))


def mm_position_ignored(inst: Any) -> None:
    inst.hasher_factory = _hasher(_gen_mm_extra_hash_keys=edited_copy(MM_POSITION_IGNORED))


def embeds_not_hashed(inst: Any) -> None:
    inst.hasher_factory = _hasher(
        _gen_prompt_embeds_extra_hash_keys=edited_copy(EMBEDS_NOT_HASHED))
