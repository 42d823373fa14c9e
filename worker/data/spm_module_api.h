// The C interface of libqlora_spm (spm_module.cc), the one place that links libsentencepiece.
// Debian's libsentencepiece exports its own copy of protobuf-lite; loaded beside the system
// libprotobuf (coordinator, worker: gRPC) it crashes protobuf's static initialisation. So the
// worker never links it: SpmModel dlopens libqlora_spm with RTLD_LOCAL | RTLD_DEEPBIND, which
// keeps that protobuf copy private to the module. Plain C types only; strings returned as
// char* are errors (nullptr on success) to be released with qlora_spm_free_string.
#pragma once

#include <stddef.h>

extern "C" {

typedef void (*qlora_spm_int_sink)(void* context, const int* ids, size_t count);
typedef void (*qlora_spm_byte_sink)(void* context, const char* bytes, size_t count);

enum qlora_spm_field { QLORA_SPM_PIECE_SIZE, QLORA_SPM_BOS, QLORA_SPM_EOS, QLORA_SPM_PAD };

void* qlora_spm_load(const char* path, char** error);
void qlora_spm_unload(void* model);
char* qlora_spm_encode(void* model, const char* text, size_t length, qlora_spm_int_sink sink,
                       void* context);
char* qlora_spm_decode(void* model, const int* ids, size_t count, qlora_spm_byte_sink sink,
                       void* context);
int qlora_spm_piece_to_id(void* model, const char* piece, size_t length);  // -1 if unknown
int qlora_spm_field(void* model, int field);
void qlora_spm_free_string(char* text);

}  // extern "C"
