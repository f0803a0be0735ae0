//! Kernel parameter structs: the promise that a Rust struct is laid out as its kernel's
//! ([`KernelParams`]), and `kernel_struct!`, which writes both from one field list.

/// A kernel parameter struct passed by value, or an element of an array the kernel reads.
///
/// # Safety
/// Implement only for `#[repr(C)]` plain-data structs whose layout equals the kernel's struct
/// field for field: `kernel_struct!` implements it together with the CUDA declaration.
pub(crate) unsafe trait KernelParams: Copy {}

/// Declares a kernel parameter struct once for both languages: the `#[repr(C)]` Rust struct and,
/// through its `cuda_decl()`, the CUDA declaration with size and alignment `static_assert`s (written
/// into the generated header the kernels include, so a mismatch fails the NVRTC compile, which CI
/// runs). Each field gives its CUDA type, and `[n]` for an array.
macro_rules! kernel_struct {
    (
        $(#[doc = $doc:literal])*
        $vis:vis struct $name:ident $(align($align:literal))? {
            $( $(#[doc = $fdoc:literal])* $field:ident : $ty:ty => $cty:literal $([$n:literal])? ),* $(,)?
        }
    ) => {
        $(#[doc = $doc])*
        #[repr(C $(, align($align))?)]
        #[derive(Clone, Copy, Debug, Default)]
        $vis struct $name {
            $( $(#[doc = $fdoc])* pub $field: $ty, )*
        }

        // SAFETY: `#[repr(C)]` plain data (integers, floats, device addresses as u64, nested
        // kernel structs); the CUDA side is generated from the same field list by `cuda_decl`
        // and asserts this struct's size and every field's size and alignment.
        unsafe impl $crate::backend::cuda::runtime::KernelParams for $name {}
        // SAFETY: as above: plain data the device may read by value from an uploaded array.
        unsafe impl cudarc::driver::DeviceRepr for $name {}

        impl $name {
            /// The CUDA declaration of this struct, with layout asserts against this mirror.
            pub fn cuda_decl() -> String {
                let mut s = String::new();
                $( s += &format!("//{}\n", $doc); )*
                s += &format!("struct {} {{\n", stringify!($name));
                $(
                    $( s += &format!("  //{}\n", $fdoc); )*
                    s += &format!("  {} {}{};\n", $cty, stringify!($field), concat!($("[", $n, "]")?));
                )*
                s += "};\n";
                s += &format!(
                    "static_assert(sizeof({0}) == {1}, \"{0}: size differs from its Rust mirror\");\n",
                    stringify!($name), std::mem::size_of::<$name>()
                );
                // Same field order, each field's size and alignment equal, the same total size:
                // C and Rust then lay the struct out identically.
                $(
                    s += &format!(
                        "static_assert(sizeof({0}::{1}) == {2} && alignof(decltype({0}::{1})) == {3}, \"{0}.{1}: size or \
                         alignment differs from its Rust mirror\");\n",
                        stringify!($name),
                        stringify!($field),
                        std::mem::size_of::<$ty>(),
                        std::mem::align_of::<$ty>()
                    );
                )*
                s
            }
        }
    };
}
pub(crate) use kernel_struct;
