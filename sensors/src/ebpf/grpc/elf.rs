//! ELF look-ups for placing uprobes: function symbols turned into the file
//! offsets that libbpf's `attach_uprobe` wants, and the build information a
//! Go executable carries (Go and module versions), which survives stripping.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use object::read::ReadCache;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

/// One ELF file, opened lazily: only the parts looked at are read.
pub(crate) struct Elf {
    cache: ReadCache<File>,
}

/// What a symbol search found in one file.
#[derive(Debug, Default)]
pub(crate) struct Symbols {
    /// Whether the file has a full symbol table (`.symtab`); a stripped file
    /// only has the exported `.dynsym`, or nothing.
    pub has_symtab: bool,
    /// Name -> file offset of each wanted function that is defined here.
    pub offsets: HashMap<String, u64>,
}

impl Elf {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            cache: ReadCache::new(File::open(path)?),
        })
    }

    fn parse(&self) -> Result<object::File<'_, &ReadCache<File>>, String> {
        object::File::parse(&self.cache).map_err(|e| format!("not a readable ELF file: {e}"))
    }

    /// Finds the defined functions whose name `wanted` accepts, in `.symtab`
    /// and `.dynsym`, with their file offsets.
    pub fn functions(&self, wanted: impl Fn(&str) -> bool) -> Result<Symbols, String> {
        let obj = self.parse()?;
        let mut out = Symbols {
            has_symtab: obj.symbols().next().is_some(),
            offsets: HashMap::new(),
        };
        for sym in obj.symbols().chain(obj.dynamic_symbols()) {
            if !sym.is_definition() || sym.kind() != SymbolKind::Text {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            if !wanted(name) || out.offsets.contains_key(name) {
                continue;
            }
            if let Some(off) = file_offset(&obj, sym.address()) {
                out.offsets.insert(name.to_owned(), off);
            }
        }
        Ok(out)
    }

    /// `len` bytes of the file at `offset` (fewer at its end).
    pub fn read_at(&self, offset: u64, len: u64) -> Option<Vec<u8>> {
        use object::ReadRef;
        (&self.cache)
            .read_bytes_at(offset, len)
            .ok()
            .map(<[u8]>::to_vec)
    }

    /// The `.go.buildinfo` of a Go executable: (Go version, module info).
    /// `None` for anything that is not a Go program.
    pub fn go_build_info(&self) -> Option<(String, String)> {
        let obj = self.parse().ok()?;
        let sect = obj.section_by_name(".go.buildinfo")?;
        let data = sect.data().ok()?;
        parse_build_info(data, |addr, len| {
            obj.sections()
                .find_map(|s| s.data_range(addr, len).ok().flatten())
                .map(<[u8]>::to_vec)
        })
    }
}

/// File offset of a virtual address: through the loadable segment that maps
/// it (what libbpf does for a symbol's st_value too).
fn file_offset<'d, O: Object<'d>>(obj: &O, vaddr: u64) -> Option<u64> {
    obj.segments().find_map(|seg| {
        let (off, size) = seg.file_range();
        let start = seg.address();
        (vaddr >= start && vaddr < start + size).then(|| off + (vaddr - start))
    })
}

const BUILDINFO_MAGIC: &[u8] = b"\xff Go buildinf:";

fn uvarint(data: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &b) in data.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((v, i + 1));
        }
    }
    None
}

/// Parses the `.go.buildinfo` header. Go >= 1.18 stores the two strings
/// inline (flag bit 2); older versions store pointers to Go string headers,
/// resolved with `read(vaddr, len)`.
pub(crate) fn parse_build_info(
    data: &[u8],
    read: impl Fn(u64, u64) -> Option<Vec<u8>>,
) -> Option<(String, String)> {
    if data.len() < 32 || !data.starts_with(BUILDINFO_MAGIC) {
        return None;
    }
    let ptr_size = usize::from(data[14]);
    let flags = data[15];
    if flags & 2 != 0 {
        let mut rest = &data[32..];
        let mut take = || {
            let (len, n) = uvarint(rest)?;
            let len = usize::try_from(len).ok()?;
            let s = rest.get(n..n + len)?;
            rest = &rest[n + len..];
            Some(String::from_utf8_lossy(s).into_owned())
        };
        let version = take()?;
        let modinfo = take().unwrap_or_default();
        return Some((version, modinfo));
    }
    if ptr_size != 8 || flags & 1 != 0 {
        return None; // 32-bit or big-endian: not a target of these probes
    }
    let word = |b: &[u8]| {
        b.get(..8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
    };
    let string_at = |hdr_addr: u64| -> Option<String> {
        let hdr = read(hdr_addr, 16)?;
        let (ptr, len) = (word(&hdr)?, word(&hdr[8..])?);
        if len == 0 {
            return Some(String::new());
        }
        Some(String::from_utf8_lossy(&read(ptr, len)?).into_owned())
    };
    let version = string_at(word(&data[16..])?)?;
    let modinfo = string_at(word(&data[24..])?).unwrap_or_default();
    Some((version, modinfo))
}

/// `(major, minor)` of a Go version string such as "go1.22.3" or
/// "devel go1.23-abc": the first "go1.N" in it.
pub(crate) fn go_minor_version(version: &str) -> Option<u32> {
    let at = version.find("go1.")?;
    let digits: String = version[at + 4..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The version of `module` among the dependencies listed in a Go module
/// info string (`dep\tPATH\tVERSION\tSUM` lines; a `=>` line right after
/// gives a replacement, whose version wins).
pub(crate) fn module_version(modinfo: &str, module: &str) -> Option<String> {
    let mut found = None;
    let mut lines = modinfo.lines().peekable();
    while let Some(line) = lines.next() {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() >= 3 && (f[0] == "dep" || f[0] == "mod") && f[1] == module {
            found = Some(f[2].to_owned());
            if let Some(next) = lines.peek() {
                let r: Vec<&str> = next.split('\t').collect();
                if r.first() == Some(&"=>") && r.len() >= 3 {
                    found = Some(format!("{} (replaced by {} {})", f[2], r[1], r[2]));
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline_info(version: &str, modinfo: &str) -> Vec<u8> {
        let mut d = BUILDINFO_MAGIC.to_vec();
        d.push(8);
        d.push(2);
        d.resize(32, 0);
        for s in [version, modinfo] {
            d.push(s.len() as u8); // short strings: one varint byte
            d.extend_from_slice(s.as_bytes());
        }
        d
    }

    #[test]
    fn reads_inline_build_info() {
        let modinfo = "path\tqosd.local/x\nmod\tqosd.local/x\t(devel)\t\n\
                       dep\tgoogle.golang.org/grpc\tv1.68.2\th1:abc=\n";
        let got = parse_build_info(&inline_info("go1.26.8", modinfo), |_, _| None).unwrap();
        assert_eq!(got.0, "go1.26.8");
        assert_eq!(
            module_version(&got.1, "google.golang.org/grpc").as_deref(),
            Some("v1.68.2")
        );
        assert_eq!(module_version(&got.1, "golang.org/x/net"), None);
    }

    #[test]
    fn reads_pointer_build_info_of_old_go() {
        // Header with two pointers to string headers, then the strings.
        let mut d = BUILDINFO_MAGIC.to_vec();
        d.push(8);
        d.push(0);
        d.extend_from_slice(&0x1000u64.to_le_bytes());
        d.extend_from_slice(&0x1010u64.to_le_bytes());
        let mem: HashMap<u64, Vec<u8>> = [
            (
                0x1000,
                [0x2000u64.to_le_bytes(), 8u64.to_le_bytes()].concat(),
            ),
            (
                0x1010,
                [0x3000u64.to_le_bytes(), 0u64.to_le_bytes()].concat(),
            ),
            (0x2000, b"go1.16.2".to_vec()),
        ]
        .into_iter()
        .collect();
        let got = parse_build_info(&d, |a, n| mem.get(&a).map(|v| v[..n as usize].to_vec()));
        assert_eq!(got, Some(("go1.16.2".into(), String::new())));
    }

    #[test]
    fn rejects_what_is_not_build_info() {
        assert_eq!(
            parse_build_info(b"not go at all, no magic here......", |_, _| None),
            None
        );
    }

    #[test]
    fn go_versions_and_replacements() {
        assert_eq!(go_minor_version("go1.26.8"), Some(26));
        assert_eq!(go_minor_version("devel go1.23-abc"), Some(23));
        assert_eq!(go_minor_version("go2"), None);
        let m = "dep\tgoogle.golang.org/grpc\tv1.60.0\th1:x=\n=>\t../grpc\t(devel)\t\n";
        assert_eq!(
            module_version(m, "google.golang.org/grpc").as_deref(),
            Some("v1.60.0 (replaced by ../grpc (devel))")
        );
    }

    #[test]
    fn finds_its_own_functions_at_file_offsets() {
        // The test binary itself: a real ELF with a symbol table. The file
        // offset must point at the same bytes the symbol's address maps.
        let exe = std::env::current_exe().unwrap();
        let elf = Elf::open(&exe).unwrap();
        let syms = elf.functions(|n| n == "main").unwrap();
        assert!(syms.has_symtab);
        let off = *syms.offsets.get("main").expect("main in the test binary");
        let file = std::fs::read(&exe).unwrap();
        let obj = object::File::parse(&*file).unwrap();
        let sym = obj.symbols().find(|s| s.name() == Ok("main")).unwrap();
        let sect = obj.section_by_index(sym.section_index().unwrap()).unwrap();
        let (sect_off, _) = sect.file_range().unwrap();
        assert_eq!(off, sect_off + (sym.address() - sect.address()));
    }
}
