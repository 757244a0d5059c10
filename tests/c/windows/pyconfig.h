/* pyconfig.h -- a stand-in for CPython's PC/pyconfig.h, 64-bit Windows.
 *
 * Only for tests/test_cross_build.py: it compiles csrc/windows/_corewin.c
 * for Windows with zig against this interpreter's headers, which are the
 * same on every OS but for pyconfig.h (a Linux one would pull in POSIX
 * headers).  The facts below are Windows's (LLP64, wchar_t of 2 bytes, NT
 * threads); the real build on Windows uses the real file.
 */
#ifndef Py_CONFIG_H
#define Py_CONFIG_H
#define MS_WIN32
#define MS_WIN64
#define MS_WINDOWS
#define NT_THREADS
#define WITH_THREAD
#define Py_WIN_WIDE_FILENAMES
#define PY_LONG_LONG        long long
#define PY_LLONG_MIN        LLONG_MIN
#define PY_LLONG_MAX        LLONG_MAX
#define PY_ULLONG_MAX       ULLONG_MAX
#define SIZEOF_INT          4
#define SIZEOF_LONG         4
#define SIZEOF_LONG_LONG    8
#define SIZEOF_DOUBLE       8
#define SIZEOF_FLOAT        4
#define SIZEOF_SHORT        2
#define SIZEOF_VOID_P       8
#define SIZEOF_SIZE_T       8
#define SIZEOF_TIME_T       8
#define SIZEOF_OFF_T        4
#define SIZEOF_FPOS_T       8
#define SIZEOF_HKEY         8
#define SIZEOF_WCHAR_T      2
#define SIZEOF__BOOL        1
#define SIZEOF_PID_T        SIZEOF_INT
#define ALIGNOF_SIZE_T      8
#define ALIGNOF_LONG        4
#define ALIGNOF_MAX_ALIGN_T 8
#define HAVE_UINTPTR_T      1
#define HAVE_INTPTR_T       1
#define HAVE_DECL_TZNAME    1
#define HAVE_WCSCOLL        1
#define HAVE_STDDEF_H       1
#define HAVE_SYS_STAT_H     1
#define HAVE_SYS_TYPES_H    1
#define HAVE_WCHAR_H        1
#define HAVE_SIGNAL_H       1
#define HAVE_ERRNO_H        1
#define HAVE_FCNTL_H        1
#define HAVE_PROCESS_H      1
#define HAVE_DIRECT_H       1
#define HAVE_IO_H           1
#define DONT_HAVE_SIG_ALARM
#define DONT_HAVE_SIG_PAUSE
#define LONG_BIT 32
#define WORD_BIT 32
#define PLATFORM "win32"
#include <basetsd.h>
typedef SSIZE_T ssize_t;
#define HAVE_SSIZE_T    1
#define PY_SUPPORT_TIER 1
#endif
