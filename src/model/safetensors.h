/* A strict reader of the safetensors container (header + byte ranges), dtype-agnostic. */
#ifndef FLAME_MODEL_SAFETENSORS_H
#define FLAME_MODEL_SAFETENSORS_H

#include "core/common.h"

#define FLAME_MAX_HEADER_BYTES ((uint64_t)100 << 20)
#define FL_ST_MAX_DIMS 8

/* I8: int8 row-wise quantized embedding tables only (the model layer enforces that). */
typedef enum fl_dtype { FL_DTYPE_UNKNOWN = 0, FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16, FL_DTYPE_I8 } fl_dtype;

typedef struct fl_st_tensor {
    char *name;
    char dtype_name[16];
    fl_dtype dtype;
    int32_t ndim;
    int64_t shape[FL_ST_MAX_DIMS];
    uint64_t begin, end; /* relative to the data buffer */
    bool used;
} fl_st_tensor;

typedef struct fl_st_file {
    const uint8_t *data; /* start of the data buffer */
    uint64_t data_len;
    fl_st_tensor *tensors; /* sorted by name */
    size_t num_tensors;
    char *config_json; /* __metadata__["flame.config"], NUL-terminated; NULL if absent */
} fl_st_file;

/* Parses and checks the container held in bytes[0..len): header length, JSON, entries,
 * ranges inside the data buffer, no overlaps, known dtypes, byte size == shape x dtype.
 * On failure FLAME_ERR_FORMAT naming the tensor; *f is left empty. */
flame_status fl_st_parse(const uint8_t *bytes, uint64_t len, fl_st_file *f);
void fl_st_free(fl_st_file *f);
/* Binary search by name; NULL if absent. */
fl_st_tensor *fl_st_find(fl_st_file *f, const char *name);
size_t fl_dtype_size(fl_dtype d);

#endif
