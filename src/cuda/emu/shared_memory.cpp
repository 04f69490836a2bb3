// src/cuda/emu/shared_memory.cpp — the __shared__ arrays of a kernel, found in the symbol table.
//
// On the emulator a __shared__ array is a function-local static of the kernel (cuda_runtime.h),
// one instance reused by each block in turn. Shared memory is undefined when a block starts, so
// the execution model fills every array of the kernel with 0xFF bytes before each block (NaN as
// float, -1 as int): a read before the block wrote shows. To find the arrays of a kernel,
// template or not, the emulator reads the symbol table of the loaded object that holds the
// kernel's code: the kernel is the function symbol at that address, and its local statics are
// the writable object symbols named _ZZ<encoding>E<entity>, where _Z<encoding> is the kernel's
// mangled name (Itanium C++ ABI 5.1.6, "Scope Encoding"). A section attribute on __shared__
// would be simpler, but GCC ignores section attributes on the statics of templates (GCC bug
// 88061), and the attention kernels are templates.
//
// Limits: every writable function-local static of a kernel counts as shared memory; __shared__
// arrays declared in a __device__ function rather than in the kernel are not found; in a stripped
// binary (no .symtab) nothing is found, which is reported once per kernel on stderr.
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "emulator.hpp"

namespace oasis_emu {
namespace {

/// A loaded object (the main program or a shared library): its file and load bias.
struct LoadedObject {
  std::string path;
  std::uintptr_t bias = 0;  ///< run-time address = bias + st_value
};

bool object_containing(const void* addr, LoadedObject* out) {
  struct Search {
    std::uintptr_t addr;
    LoadedObject* out;
  } search{reinterpret_cast<std::uintptr_t>(addr), out};
  auto visit = [](dl_phdr_info* info, std::size_t, void* data) -> int {
    auto* s = static_cast<Search*>(data);
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& ph = info->dlpi_phdr[i];
      const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
      if (ph.p_type == PT_LOAD && s->addr >= lo && s->addr < lo + ph.p_memsz) {
        s->out->path = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : "/proc/self/exe";
        s->out->bias = info->dlpi_addr;
        return 1;
      }
    }
    return 0;
  };
  return dl_iterate_phdr(visit, &search) == 1;
}

/// What the emulator needs of an object's symbol table.
struct Symbols {
  std::map<std::uintptr_t, std::string> functions;  ///< st_value -> mangled name
  /// Writable data objects whose names start with _ZZ (function-local statics): name -> (st_value, size).
  std::vector<std::pair<std::string, std::pair<std::uintptr_t, std::size_t>>> local_statics;  // sorted by name
};

/// Reads the ELF symbol table (.symtab) of `path`; empty when the file has none.
Symbols read_symbols(const std::string& path) {
  Symbols out;
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return out;
  struct stat st {};
  void* map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size > 0)
    map = mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return out;
  const auto* bytes = static_cast<const unsigned char*>(map);
  const std::size_t size = static_cast<std::size_t>(st.st_size);
  const auto* eh = reinterpret_cast<const ElfW(Ehdr)*>(bytes);
  const bool ok = size >= sizeof(ElfW(Ehdr)) && std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 &&
                  eh->e_ident[EI_CLASS] == (sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32) &&
                  eh->e_shoff + static_cast<std::size_t>(eh->e_shnum) * sizeof(ElfW(Shdr)) <= size;
  if (ok) {
    const auto* sh = reinterpret_cast<const ElfW(Shdr)*>(bytes + eh->e_shoff);
    for (int s = 0; s < eh->e_shnum; ++s) {
      if (sh[s].sh_type != SHT_SYMTAB || sh[s].sh_link >= eh->e_shnum) continue;
      const ElfW(Shdr)& strtab = sh[sh[s].sh_link];
      if (sh[s].sh_offset + sh[s].sh_size > size || strtab.sh_offset + strtab.sh_size > size) continue;
      const auto* sym = reinterpret_cast<const ElfW(Sym)*>(bytes + sh[s].sh_offset);
      const char* names = reinterpret_cast<const char*>(bytes + strtab.sh_offset);
      const std::size_t count = sh[s].sh_size / sizeof(ElfW(Sym));
      for (std::size_t k = 0; k < count; ++k) {
        if (sym[k].st_name >= strtab.sh_size) continue;
        const char* name = names + sym[k].st_name;
        const int type = ELF64_ST_TYPE(sym[k].st_info);
        if (type == STT_FUNC && sym[k].st_value != 0) {
          out.functions.emplace(sym[k].st_value, name);
        } else if (type == STT_OBJECT && std::strncmp(name, "_ZZ", 3) == 0 && sym[k].st_shndx < eh->e_shnum &&
                   (sh[sym[k].st_shndx].sh_flags & SHF_WRITE)) {  // not __func__ and other read-only statics
          out.local_statics.push_back({name, {sym[k].st_value, sym[k].st_size}});
        }
      }
    }
  }
  munmap(map, size);
  std::sort(out.local_statics.begin(), out.local_statics.end());
  return out;
}

const Symbols& symbols_of(const std::string& path) {
  static std::map<std::string, Symbols> tables;
  auto it = tables.find(path);
  if (it == tables.end()) it = tables.emplace(path, read_symbols(path)).first;
  return it->second;
}

std::vector<ByteRange> find_shared_arrays(const void* kernel, const char* name) {
  std::vector<ByteRange> ranges;
  LoadedObject obj;
  const Symbols* syms = object_containing(kernel, &obj) ? &symbols_of(obj.path) : nullptr;
  const auto fn = syms ? syms->functions.find(reinterpret_cast<std::uintptr_t>(kernel) - obj.bias)
                       : std::map<std::uintptr_t, std::string>::const_iterator();
  if (!syms || fn == syms->functions.end() || fn->second.rfind("_Z", 0) != 0) {
    std::fprintf(stderr,
                 "oasis CUDA emulator: the __shared__ arrays of kernel %s are not found (no symbol table?); "
                 "they are not refilled between blocks\n",
                 name);
    return ranges;
  }
  const std::string prefix = "_ZZ" + fn->second.substr(2) + "E";
  auto it = std::lower_bound(syms->local_statics.begin(), syms->local_statics.end(),
                             std::make_pair(prefix, std::make_pair(std::uintptr_t{0}, std::size_t{0})));
  for (; it != syms->local_statics.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    if (it->second.second > 0)
      ranges.push_back({reinterpret_cast<unsigned char*>(obj.bias + it->second.first), it->second.second});
  return ranges;
}

}  // namespace

const std::vector<ByteRange>& shared_arrays(const void* kernel, const char* name) {
  static std::map<const void*, std::vector<ByteRange>> cache;  // under the launch lock (fibers.cpp)
  auto it = cache.find(kernel);
  if (it == cache.end()) it = cache.emplace(kernel, find_shared_arrays(kernel, name)).first;
  return it->second;
}

}  // namespace oasis_emu
