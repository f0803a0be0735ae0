//! Number formats, packing, quantization, scale layouts and the tensor types.

pub mod e2m1;
pub mod e4m3;
pub mod layout;
pub mod meta;
pub mod out;
pub mod pack;
pub mod quant;
pub mod tensor;
pub mod w16_pack;

pub use e2m1::{e2m1_to_f32, f32_to_e2m1, E2M1_MAX};
pub use e4m3::{e4m3_is_nan, e4m3_to_f32, f32_to_e4m3, E4M3_MAX};
pub use layout::{blocked_dims, blocked_offset, blocked_to_plain, plain_to_blocked, ScaleLayout};
pub use meta::Nvfp4Meta;
pub use out::{OutTensor, OutputDtype};
pub use pack::{nibble, pack_nibbles, unpack_nibbles};
pub use quant::{modelopt_global_scale, quantize, quantize_nan_blocks, GlobalScale, MIN_GLOBAL_SCALE, NAN_SCALE};
pub use tensor::{F16Tensor, Nvfp4Tensor};
pub use w16_pack::{dual_packed_rows, pack_w16, pack_w16_dual, packed_len, PackAct};
