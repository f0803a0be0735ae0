//! safetensors case files and checkpoint weights.
