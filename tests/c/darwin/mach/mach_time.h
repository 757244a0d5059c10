/* mach/mach_time.h -- test double of macOS's <mach/mach_time.h> (see
 * ../libproc.h).  The model's timebase is Apple Silicon's, 125/3 ns a
 * tick (Intel Macs: 1/1), so that a missing conversion shows. */
#ifndef SBX_FAKE_MACH_MACH_TIME_H
#define SBX_FAKE_MACH_MACH_TIME_H

#include <stdint.h>

typedef int kern_return_t; /* <mach/kern_return.h> */
#define KERN_SUCCESS 0

struct mach_timebase_info {
    uint32_t numer;
    uint32_t denom;
};
typedef struct mach_timebase_info *mach_timebase_info_t;
typedef struct mach_timebase_info mach_timebase_info_data_t;

kern_return_t mach_timebase_info(mach_timebase_info_t info);
uint64_t mach_absolute_time(void);

#endif /* SBX_FAKE_MACH_MACH_TIME_H */
