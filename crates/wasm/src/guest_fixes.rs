//! Repairs for known defects in the code guest toolchains generate, applied
//! to a component's bytes before it is compiled (so plugins built earlier are
//! repaired too, without a rebuild).
//!
//! **componentize-py 0.19.0 – 0.25.1 leaks every `bytes` it hands to the
//! host.** Its runtime lowers a Python `bytes` into a `list<u8>` (an output
//! tensor's data, a `bytes` argument of a host import such as
//! `ops.frombuffer`) by copying it into a fresh allocation, returned to the
//! adapter module wit-dylib generates through `wit_dylib_pop_list`, and
//! nothing ever frees it: each call loses its bytes inside the plugin's
//! linear memory until the memory cap stops the instance. Lists the adapter
//! lowers itself it frees through `wit_dylib_dealloc_bytes(cx, ptr, size,
//! align, defer = 1)`, which hands the block to the call's context; the
//! context frees it when the call is over (after the host has read an
//! import's arguments; in post-return for an export's result).
//!
//! [`repair`] acts only on componentize-py's components (one of their core
//! modules exports `PyInit_componentize_py_runtime`): other toolchains build
//! on wit-dylib too (jco's QuickJS backend), and their runtimes may return a
//! pointer they still own. In such a component it finds the adapter module
//! (it imports both functions with wit-dylib's signatures) and routes its
//! calls to `wit_dylib_pop_list` through a function appended to the module
//! that does the same for the pointer the runtime returned. The runtime returns a pointer only for
//! `list<u8>` and `list<s8>`, so the block's size is the list's length and
//! its alignment 1, the layout it was allocated with.
//!
//! `tern plugin build` records the componentize-py version in a
//! [`TOOLCHAIN_SECTION`] custom section; a component that names a version
//! after 0.25.1 is left alone (a fixed runtime would free the block itself),
//! as is one marked as already repaired.

use std::borrow::Cow;

use wasm_encoder::reencode::Reencode;
use wasm_encoder::{ComponentSectionId, Instruction, MemArg, RawSection, ValType};
use wasmparser::{Chunk, CompositeInnerType, Encoding, Parser, Payload, TypeRef};

/// The custom section in which `tern plugin build` names the toolchain that
/// built a component, as `<tool> <version>` (e.g. `componentize-py 0.25.1`).
pub const TOOLCHAIN_SECTION: &str = "tern-toolchain";

/// The repairs [`repair`] makes, named; part of every `.cwasm` cache key.
pub const LEVEL: &str = "componentize-py-pop-list-dealloc";

/// The custom section [`repair`] adds to a module it changed.
const REPAIRED_SECTION: &str = "tern-repaired-pop-list";

/// The newest componentize-py whose runtime has the leak.
const LEAKY_UNTIL: (u32, u32, u32) = (0, 25, 1);

/// What [`repair`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Repairs {
    /// Calls to `wit_dylib_pop_list` now free what they return.
    pub pop_list_calls: u32,
}

/// Returns `bytes` with the known defects repaired, or unchanged (borrowed)
/// when there is nothing to repair. Input that does not parse is returned
/// unchanged: compiling it reports the error in the usual words.
pub fn repair(bytes: &[u8]) -> (Cow<'_, [u8]>, Repairs) {
    let mut repairs = Repairs::default();
    if !is_component(bytes) || !is_componentize_py(bytes) || toolchain_is_fixed(bytes) {
        return (Cow::Borrowed(bytes), repairs);
    }
    match rewrite_component(bytes, &mut repairs) {
        Ok(Some(out)) => (Cow::Owned(out), repairs),
        Ok(None) => (Cow::Borrowed(bytes), Repairs::default()),
        Err(e) => {
            tracing::debug!("component left as it is: {e}");
            (Cow::Borrowed(bytes), Repairs::default())
        }
    }
}

/// Appends the [`TOOLCHAIN_SECTION`] naming `tool` and `version` to a
/// component (a custom section may end a component).
pub fn mark_toolchain(component: &mut Vec<u8>, tool: &str, version: &str) {
    use wasm_encoder::Encode;
    let section = wasm_encoder::CustomSection {
        name: TOOLCHAIN_SECTION.into(),
        data: format!("{tool} {version}").into_bytes().into(),
    };
    component.push(0);
    section.encode(component);
}

fn is_component(bytes: &[u8]) -> bool {
    matches!(
        Parser::new(0).parse(bytes, true),
        Ok(Chunk::Parsed {
            payload: Payload::Version {
                encoding: Encoding::Component,
                ..
            },
            ..
        })
    )
}

/// The export by which componentize-py's runtime module is known.
const COMPONENTIZE_PY_RUNTIME: &str = "PyInit_componentize_py_runtime";

/// True when one of the component's top-level core modules is
/// componentize-py's runtime.
fn is_componentize_py(bytes: &[u8]) -> bool {
    let mut found = false;
    let walked = walk(bytes, |payload, bytes| {
        if let Payload::ModuleSection {
            unchecked_range, ..
        } = payload
        {
            found |= exports(&bytes[unchecked_range.clone()], COMPONENTIZE_PY_RUNTIME);
        }
        Ok(())
    });
    walked.is_ok() && found
}

/// Whether the core module exports something named `name`.
fn exports(module: &[u8], name: &str) -> bool {
    for payload in Parser::new(0).parse_all(module) {
        match payload {
            Ok(Payload::ExportSection(reader)) => {
                return reader.into_iter().flatten().any(|e| e.name == name);
            }
            Ok(Payload::CodeSectionStart { .. }) | Err(_) => return false,
            Ok(_) => {}
        }
    }
    false
}

/// True when the component says it was built by a componentize-py newer
/// than the leaky ones.
fn toolchain_is_fixed(bytes: &[u8]) -> bool {
    let Some(mark) = top_level_custom(bytes, TOOLCHAIN_SECTION) else {
        return false;
    };
    let text = String::from_utf8_lossy(&mark).into_owned();
    let Some(version) = text.strip_prefix("componentize-py ") else {
        return false;
    };
    let mut parts = version.trim().split('.').map(|p| p.parse::<u32>().ok());
    match (
        parts.next().flatten(),
        parts.next().flatten(),
        parts.next().flatten(),
    ) {
        (Some(a), Some(b), Some(c)) => (a, b, c) > LEAKY_UNTIL,
        _ => false,
    }
}

fn top_level_custom(bytes: &[u8], name: &str) -> Option<Vec<u8>> {
    let mut found = None;
    walk(bytes, |payload, _| {
        if let Payload::CustomSection(c) = payload {
            if c.name() == name {
                found = Some(c.data().to_vec());
            }
        }
        Ok(())
    })
    .ok()?;
    found
}

/// Calls `each` with every top-level payload of the component or module in
/// `bytes` (nested modules and components are one payload each, not entered).
fn walk<'a>(
    bytes: &'a [u8],
    mut each: impl FnMut(&Payload<'a>, &'a [u8]) -> wasmparser::Result<()>,
) -> wasmparser::Result<()> {
    let mut parser = Parser::new(0);
    let mut offset = 0;
    loop {
        let (payload, consumed) = match parser.parse(&bytes[offset..], true)? {
            Chunk::Parsed { payload, consumed } => (payload, consumed),
            Chunk::NeedMoreData(_) => unreachable!("eof is set: a short input is an error"),
        };
        offset += consumed;
        match &payload {
            Payload::ModuleSection {
                unchecked_range, ..
            }
            | Payload::ComponentSection {
                unchecked_range, ..
            } => {
                // The parser has moved past the nested one; so must we.
                each(&payload, bytes)?;
                offset = unchecked_range.end;
            }
            Payload::End(_) => return Ok(()),
            _ => each(&payload, bytes)?,
        }
    }
}

/// The component with every leaky adapter module repaired; `None` when none
/// was found.
fn rewrite_component(bytes: &[u8], repairs: &mut Repairs) -> Result<Option<Vec<u8>>, String> {
    let mut out = wasm_encoder::Component::new();
    let mut changed = false;
    let mut failure = None;
    walk(bytes, |payload, bytes| {
        match payload {
            Payload::Version { .. } => {}
            Payload::ModuleSection {
                unchecked_range, ..
            }
            | Payload::ComponentSection {
                unchecked_range, ..
            } => {
                let inner = &bytes[unchecked_range.clone()];
                let (id, fixed) = match payload {
                    Payload::ModuleSection { .. } => (
                        ComponentSectionId::CoreModule,
                        repair_module(inner, repairs),
                    ),
                    _ => (
                        ComponentSectionId::Component,
                        rewrite_component(inner, repairs),
                    ),
                };
                let fixed = fixed.unwrap_or_else(|e| {
                    failure.get_or_insert(e);
                    None
                });
                changed |= fixed.is_some();
                out.section(&RawSection {
                    id: id as u8,
                    data: fixed.as_deref().unwrap_or(inner),
                });
            }
            other => {
                if let Some((id, range)) = other.as_section() {
                    out.section(&RawSection {
                        id,
                        data: &bytes[range],
                    });
                }
            }
        }
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(changed.then(|| out.finish()))
}

/// What the pre-scan of a core module found.
struct AdapterShape {
    pop_list: u32,
    pop_list_type: u32,
    dealloc_bytes: u32,
    /// Functions imported plus defined: the index the wrapper gets.
    wrapper: u32,
}

fn scan_module(module: &[u8]) -> wasmparser::Result<Option<AdapterShape>> {
    let mut func_types: Vec<Option<(Vec<wasmparser::ValType>, Vec<wasmparser::ValType>)>> =
        Vec::new();
    let mut imported_funcs = 0u32;
    let mut defined_funcs = 0u32;
    let mut pop_list = None;
    let mut dealloc_bytes = None;
    let mut memory0_is_32 = None;
    for payload in Parser::new(0).parse_all(module) {
        match payload? {
            Payload::TypeSection(reader) => {
                for group in reader {
                    for sub in group?.into_types() {
                        func_types.push(match &sub.composite_type.inner {
                            CompositeInnerType::Func(f) => {
                                Some((f.params().to_vec(), f.results().to_vec()))
                            }
                            _ => None,
                        });
                    }
                }
            }
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    let import = import?;
                    match import.ty {
                        TypeRef::Func(ty) => {
                            match import.name {
                                "wit_dylib_pop_list" => pop_list = Some((imported_funcs, ty)),
                                "wit_dylib_dealloc_bytes" => {
                                    dealloc_bytes = Some((imported_funcs, ty))
                                }
                                _ => {}
                            }
                            imported_funcs += 1;
                        }
                        TypeRef::Memory(m) => {
                            memory0_is_32.get_or_insert(!m.memory64);
                        }
                        _ => {}
                    }
                }
            }
            Payload::MemorySection(reader) => {
                for m in reader {
                    memory0_is_32.get_or_insert(!m?.memory64);
                }
            }
            Payload::FunctionSection(reader) => defined_funcs += reader.count(),
            Payload::CustomSection(c) if c.name() == REPAIRED_SECTION => return Ok(None),
            _ => {}
        }
    }
    let (Some((pop_list, pop_ty)), Some((dealloc_bytes, dealloc_ty)), Some(true)) =
        (pop_list, dealloc_bytes, memory0_is_32)
    else {
        return Ok(None);
    };
    use wasmparser::ValType::I32;
    let sig = |t: u32| func_types.get(t as usize).cloned().flatten();
    if sig(pop_ty) != Some((vec![I32; 3], vec![I32]))
        || sig(dealloc_ty) != Some((vec![I32; 5], vec![]))
    {
        return Ok(None);
    }
    Ok(Some(AdapterShape {
        pop_list,
        pop_list_type: pop_ty,
        dealloc_bytes,
        wrapper: imported_funcs + defined_funcs,
    }))
}

/// Re-encodes the module with calls to `wit_dylib_pop_list` going through
/// the wrapper; `None` when the module is not a wit-dylib adapter.
fn repair_module(module: &[u8], repairs: &mut Repairs) -> Result<Option<Vec<u8>>, String> {
    let Some(shape) = scan_module(module).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let mut fixer = PopListFixer { shape, calls: 0 };
    let mut out = wasm_encoder::Module::new();
    fixer
        .parse_core_module(&mut out, Parser::new(0), module)
        .map_err(|e| format!("{e:?}"))?;
    out.section(&wasm_encoder::CustomSection {
        name: REPAIRED_SECTION.into(),
        data: Cow::Borrowed(&[]),
    });
    repairs.pop_list_calls += fixer.calls;
    Ok(Some(out.finish()))
}

struct PopListFixer {
    shape: AdapterShape,
    calls: u32,
}

impl PopListFixer {
    /// `(cx, ty, retptr) -> len`: the runtime's `pop_list`, then, when it
    /// returned a pointer at `*retptr`, that block deferred for freeing.
    fn wrapper(&self) -> wasm_encoder::Function {
        let (cx, retptr, len, ptr) = (0, 2, 3, 4);
        let mut f = wasm_encoder::Function::new([(2, ValType::I32)]);
        let load = MemArg {
            offset: 0,
            align: 2,
            memory_index: 0,
        };
        for i in [
            Instruction::LocalGet(cx),
            Instruction::LocalGet(1),
            Instruction::LocalGet(retptr),
            Instruction::Call(self.shape.pop_list),
            Instruction::LocalSet(len),
            Instruction::LocalGet(retptr),
            Instruction::I32Load(load),
            Instruction::LocalTee(ptr),
            Instruction::If(wasm_encoder::BlockType::Empty),
            Instruction::LocalGet(cx),
            Instruction::LocalGet(ptr),
            Instruction::LocalGet(len),
            Instruction::I32Const(1),
            Instruction::I32Const(1),
            Instruction::Call(self.shape.dealloc_bytes),
            Instruction::End,
            Instruction::LocalGet(len),
            Instruction::End,
        ] {
            f.instruction(&i);
        }
        f
    }
}

impl Reencode for PopListFixer {
    type Error = std::convert::Infallible;

    fn instruction<'a>(
        &mut self,
        arg: wasmparser::Operator<'a>,
    ) -> Result<Instruction<'a>, wasm_encoder::reencode::Error<Self::Error>> {
        if let wasmparser::Operator::Call { function_index } = arg {
            if function_index == self.shape.pop_list {
                self.calls += 1;
                return Ok(Instruction::Call(self.shape.wrapper));
            }
        }
        wasm_encoder::reencode::utils::instruction(self, arg)
    }

    fn parse_function_section(
        &mut self,
        functions: &mut wasm_encoder::FunctionSection,
        section: wasmparser::FunctionSectionReader<'_>,
    ) -> Result<(), wasm_encoder::reencode::Error<Self::Error>> {
        wasm_encoder::reencode::utils::parse_function_section(self, functions, section)?;
        functions.function(self.shape.pop_list_type);
        Ok(())
    }

    fn parse_code_section(
        &mut self,
        code: &mut wasm_encoder::CodeSection,
        section: wasmparser::CodeSectionReader<'_>,
    ) -> Result<(), wasm_encoder::reencode::Error<Self::Error>> {
        wasm_encoder::reencode::utils::parse_code_section(self, code, section)?;
        code.function(&self.wrapper());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_core_module_and_garbage_are_left_alone() {
        let module = wasm_encoder::Module::new().finish();
        assert!(matches!(repair(&module).0, Cow::Borrowed(_)));
        assert!(matches!(repair(b"not wasm").0, Cow::Borrowed(_)));
    }

    #[test]
    fn a_toolchain_newer_than_the_leaky_ones_is_trusted() {
        let mut c = wasm_encoder::Component::new().finish();
        assert!(!toolchain_is_fixed(&c));
        let mut old = c.clone();
        mark_toolchain(&mut old, "componentize-py", "0.25.1");
        assert!(!toolchain_is_fixed(&old));
        mark_toolchain(&mut c, "componentize-py", "0.26.0");
        assert!(toolchain_is_fixed(&c));
        wasmparser::Validator::new()
            .validate_all(&c)
            .expect("the marked component is valid");
    }

    /// A module shaped like wit-dylib's adapter: imports `pop_list` and
    /// `dealloc_bytes` and a memory, and exports `lower` calling `pop_list`.
    fn adapter() -> Vec<u8> {
        use wasm_encoder::*;
        let mut m = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([ValType::I32; 3], [ValType::I32]);
        types.ty().function([ValType::I32; 5], []);
        types.ty().function([], [ValType::I32]);
        m.section(&types);
        let mut imports = ImportSection::new();
        imports.import(
            "env",
            "memory",
            MemoryType {
                minimum: 1,
                maximum: None,
                memory64: false,
                shared: false,
                page_size_log2: None,
            },
        );
        imports.import("rt", "wit_dylib_pop_list", EntityType::Function(0));
        imports.import("rt", "wit_dylib_dealloc_bytes", EntityType::Function(1));
        m.section(&imports);
        let mut funcs = FunctionSection::new();
        funcs.function(2);
        m.section(&funcs);
        let mut exports = ExportSection::new();
        exports.export("lower", ExportKind::Func, 2);
        m.section(&exports);
        let mut code = CodeSection::new();
        let mut f = Function::new([]);
        for i in [
            Instruction::I32Const(7),
            Instruction::I32Const(3),
            Instruction::I32Const(64),
            Instruction::Call(0),
            Instruction::End,
        ] {
            f.instruction(&i);
        }
        code.function(&f);
        m.section(&code);
        m.finish()
    }

    /// A stand-in for componentize-py's runtime module: it exports the
    /// Python extension's init function.
    fn runtime() -> Vec<u8> {
        use wasm_encoder::*;
        let mut m = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], []);
        m.section(&types);
        let mut funcs = FunctionSection::new();
        funcs.function(0);
        m.section(&funcs);
        let mut exports = ExportSection::new();
        exports.export(COMPONENTIZE_PY_RUNTIME, ExportKind::Func, 0);
        m.section(&exports);
        let mut code = CodeSection::new();
        let mut f = Function::new([]);
        f.instruction(&Instruction::End);
        code.function(&f);
        m.section(&code);
        m.finish()
    }

    /// The adapter in a component, beside componentize-py's runtime or not.
    fn component_of(module: &[u8], with_runtime: bool) -> Vec<u8> {
        let mut c = wasm_encoder::Component::new();
        c.section(&RawSection {
            id: ComponentSectionId::CoreModule as u8,
            data: module,
        });
        if with_runtime {
            c.section(&RawSection {
                id: ComponentSectionId::CoreModule as u8,
                data: &runtime(),
            });
        }
        c.finish()
    }

    fn in_component(module: &[u8]) -> Vec<u8> {
        component_of(module, true)
    }

    #[test]
    fn a_wit_dylib_adapter_of_another_toolchain_is_left_alone() {
        // jco's QuickJS backend is built on wit-dylib too; its runtime owns what it returns.
        let component = component_of(&adapter(), false);
        let (out, repairs) = repair(&component);
        assert!(matches!(out, Cow::Borrowed(_)));
        assert_eq!(repairs, Repairs::default());
    }

    fn only_module(component: &[u8]) -> Vec<u8> {
        let mut found = None;
        walk(component, |p, bytes| {
            if let Payload::ModuleSection {
                unchecked_range, ..
            } = p
            {
                found.get_or_insert_with(|| bytes[unchecked_range.clone()].to_vec());
            }
            Ok(())
        })
        .unwrap();
        found.expect("the component holds a module")
    }

    /// Runs `lower` with a `pop_list` that writes `returned` at the return
    /// pointer and answers length 5; gives the `dealloc_bytes` calls.
    fn run(module: &[u8], returned: i32) -> (i32, Vec<[i32; 5]>) {
        use wasmtime::{Caller, Engine, Linker, Memory, MemoryType, Module, Store};
        let engine = Engine::default();
        let module = Module::new(&engine, module).expect("the module is valid");
        let mut store = Store::new(&engine, Vec::<[i32; 5]>::new());
        let memory = Memory::new(&mut store, MemoryType::new(1, None)).unwrap();
        let mut linker = Linker::new(&engine);
        linker.define(&store, "env", "memory", memory).unwrap();
        linker
            .func_wrap(
                "rt",
                "wit_dylib_pop_list",
                move |mut c: Caller<'_, Vec<[i32; 5]>>, _cx: i32, _ty: i32, retptr: i32| {
                    memory
                        .write(&mut c, retptr as usize, &returned.to_le_bytes())
                        .unwrap();
                    5
                },
            )
            .unwrap();
        linker
            .func_wrap(
                "rt",
                "wit_dylib_dealloc_bytes",
                |mut c: Caller<'_, Vec<[i32; 5]>>, a: i32, b: i32, d: i32, e: i32, f: i32| {
                    c.data_mut().push([a, b, d, e, f]);
                },
            )
            .unwrap();
        let instance = linker.instantiate(&mut store, &module).unwrap();
        let lower = instance
            .get_typed_func::<(), i32>(&mut store, "lower")
            .unwrap();
        let len = lower.call(&mut store, ()).unwrap();
        (len, store.into_data())
    }

    #[test]
    fn a_list_the_runtime_returned_as_a_pointer_is_deferred_for_freeing() {
        let component = in_component(&adapter());
        // Before: the pointer is never handed back.
        assert_eq!(run(&adapter(), 4096), (5, vec![]));
        let (fixed, repairs) = repair(&component);
        assert_eq!(repairs.pop_list_calls, 1);
        wasmparser::Validator::new()
            .validate_all(&fixed)
            .expect("the repaired component is valid");
        let module = only_module(&fixed);
        // After: freed with the call (cx 7, the pointer, its length, align 1, deferred).
        assert_eq!(run(&module, 4096), (5, vec![[7, 4096, 5, 1, 1]]));
        // A list lowered element by element (null pointer) is the adapter's own business.
        assert_eq!(run(&module, 0), (5, vec![]));
        // Repairing twice changes nothing more.
        let (again, repairs) = repair(&fixed);
        assert!(matches!(again, Cow::Borrowed(_)));
        assert_eq!(repairs, Repairs::default());
    }

    #[test]
    fn a_component_marked_as_built_by_a_fixed_componentize_py_is_not_changed() {
        let mut component = in_component(&adapter());
        mark_toolchain(&mut component, "componentize-py", "0.26.0");
        assert!(matches!(repair(&component).0, Cow::Borrowed(_)));
        let mut component = in_component(&adapter());
        mark_toolchain(&mut component, "componentize-py", "0.25.1");
        assert_eq!(repair(&component).1.pop_list_calls, 1);
    }
}
