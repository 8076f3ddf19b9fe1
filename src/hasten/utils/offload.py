"""Compatibility path ``hasten.utils.offload`` (Accelerate users write ``accelerate.utils.offload``)."""
from ..big_modeling.offload import (OffloadedWeightsLoader, PrefixedDataset, extract_submodules_state_dict,
                                    load_offloaded_weight, load_offloaded_weights, offload_state_dict, offload_weight,
                                    save_offload_index)

__all__ = ["OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict", "load_offloaded_weight",
           "load_offloaded_weights", "offload_state_dict", "offload_weight", "save_offload_index"]
